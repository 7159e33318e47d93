"""`gpujitter top` with no daemon: the probes run in-process and the CPUs view fills from the
kernel's counters where no probe covers them. Attaches the default probes to this kernel (run
under the shared lock, like the kernel tests)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from textual.widgets import DataTable

from gpujitter.probes import registry
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec
from gpujitter.tui.sources.embedded import EmbeddedSource
from gpujitter.tui.views.breakdown import GapScreen
from tests.tui.conftest import make_app, until
from tests.tui.test_app import status_line, table_rows

pytestmark = pytest.mark.kernel


def test_embedded_mode_shows_live_cpu_idle_and_probe_health() -> None:
    topo = load_topology()
    names = registry.default_names()
    source = EmbeddedSource(names, topology=topo, watch=WatchSpec(all=True), tick_s=0.5)

    async def scenario() -> None:
        app = make_app(source)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(
                pilot,
                lambda: all(p in app.model.probes for p in names) and len(app.model.cpus) > 0,
                "probe health and CPU figures",
                timeout=60,
            )
            await until(pilot, lambda: app.model.status is not None, "the self status")
            assert {app.model.probes[p].state for p in names} <= {"running", "degraded"}
            # no GPU here: NVML is reported unavailable, and the rest runs
            assert app.model.probes["nvml"].state == "unavailable"
            line = status_line(app)
            running = sum(app.model.probes[p].state == "running" for p in names)
            assert "● embedded" in line and "self cpu" in line and f"probes {running} on" in line
            await pilot.press("3")
            rows = app.model.cpu_rows()
            assert sorted(r.cpu for r in rows) == topo.cpus
            # Without the cstate probe, idle time comes from /proc/stat (or cpuidle sysfs):
            # every CPU's shares add up to at most its window.
            assert all(r.idle and sum(share for _, share in r.idle) <= 1.05 for r in rows)
            assert app.query_one("#cpus-table", DataTable).row_count == len(topo.cpus)

    asyncio.run(scenario())


def test_a_drill_beside_it_shows_the_drills_gaps_and_their_cause() -> None:
    """What an operator sees with `gpujitter top` open while `gpujitter drill contention`
    runs: the drill's stalls as gaps, run-queue wait named as their cause, in the Gaps view
    and in the breakdown of the one selected."""
    names = registry.default_names()
    source = EmbeddedSource(names, topology=load_topology(), watch=WatchSpec(all=True), tick_s=0.5)
    gpujitter = Path(sys.executable).with_name("gpujitter")

    async def scenario() -> None:
        app = make_app(source)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: "sched" in app.model.probes, "the probes", timeout=60)
            drill = await asyncio.create_subprocess_exec(
                str(gpujitter), "drill", "contention", "--duration", "6s", "--stalls", "3",
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                await until(
                    pilot,
                    lambda: (
                        sum(
                            a is not None and a.top is not None and a.top.cause == "runq_wait"
                            for _, a in app.model.gaps_newest_first()
                        )
                        >= 3
                    ),
                    "the drill's three stalls, attributed",
                    timeout=90,
                )
            finally:
                assert await drill.wait() == 0
            await pilot.press("2")
            rows = table_rows(app.query_one("#gaps-table", DataTable))
            assert sum("run-queue" in r for r in rows) >= 3, rows
            first = next(i for i, r in enumerate(rows) if "run-queue" in r)
            await pilot.press(*["down"] * first, "enter")
            await until(pilot, lambda: isinstance(app.screen, GapScreen), "the breakdown")
            top = app.screen.attribution.top  # type: ignore[attr-defined]
            assert top.cause == "runq_wait", top
            assert any("gj-drill-hog" in e for e in top.evidence), top.evidence

    asyncio.run(scenario())
