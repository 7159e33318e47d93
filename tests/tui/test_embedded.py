"""`gpujitter top` with no daemon: the probes run in-process and the CPUs view fills from the
kernel's counters where no probe covers them. Attaches the default probes to this kernel (run
under the shared lock, like the kernel tests)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from gpujitter.daemon.analysis.records import Attribution, Evidence, GpuGap, TaskEvidence
from gpujitter.probes import registry
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec
from gpujitter.tui.feeds.embedded import EmbeddedFeed
from gpujitter.tui.model import NodeModel
from gpujitter.tui.views.breakdown import GapScreen
from gpujitter.tui.views.gaps import GapsTable
from tests.tui.conftest import make_app, until
from tests.tui.test_app import status_line, table_rows

pytestmark = pytest.mark.kernel


def test_embedded_mode_shows_live_cpu_idle_and_probe_health() -> None:
    topo = load_topology()
    names = registry.default_names()
    feed = EmbeddedFeed(names, topology=topo, watch=WatchSpec(all=True), tick_s=0.5)

    async def scenario() -> None:
        app = make_app(feed)
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
            # Idle time per state (the cstate probe's, or the kernel's counters where it
            # cannot run): every CPU's shares add up to at most its window.
            assert all(sum(share for _, share in r.idle) <= 1.05 for r in rows)
            assert app.query_one("#cpus-table", DataTable).row_count == len(topo.cpus)
            await _idle_shown_where_the_kernel_counted_it(pilot, app.model)

    asyncio.run(scenario())


def _kernel_idle_s() -> float:
    """Idle time of all CPUs so far by /proc/stat (idle and iowait), in seconds."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")


async def _idle_shown_where_the_kernel_counted_it(pilot: Pilot, model: NodeModel) -> None:
    """Some CPU's idle time shows within 10 s, unless the kernel counted (almost) none in
    that time: on a node whose CPUs other work keeps busy (hogs beside the suite) there is
    nothing to show, and a view that showed some would be wrong."""
    idle_from, start = _kernel_idle_s(), time.monotonic()
    while not any(share > 0 for r in model.cpu_rows() for _, share in r.idle):
        waited = time.monotonic() - start
        if waited > 10:
            idled = _kernel_idle_s() - idle_from
            assert idled < 0.05 * waited, f"the kernel counted {idled:.2f} s idle, the view none"
            return
        await pilot.pause(0.1)


def test_a_drill_beside_it_shows_the_drills_gaps_and_their_cause() -> None:
    """What an operator sees with `gpujitter top` open while `gpujitter drill contention`
    runs: the drill's stalls as gaps, run-queue wait named as their cause, in the Gaps view
    and in the breakdown of one of them. This VM's other load makes gaps of its own beside
    them (run-queue waits too), and can miss a target of the drill's own score (exit 1;
    test_drill scores it): the stall's gap is found by the times the drill reports."""
    names = registry.default_names()
    feed = EmbeddedFeed(names, topology=load_topology(), watch=WatchSpec(all=True), tick_s=0.5)
    gpujitter = Path(sys.executable).with_name("gpujitter")

    async def scenario() -> None:
        app = make_app(feed)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: "sched" in app.model.probes, "the probes", timeout=60)
            drill = await asyncio.create_subprocess_exec(
                str(gpujitter), "drill", "contention", "--duration", "6s", "--stalls", "3",
                "--json", stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            out, _ = await drill.communicate()
            assert drill.returncode in (0, 1), out  # 1: a target of its own score missed
            stalls = [(s["t0_ns"], s["t1_ns"]) for s in json.loads(out)["loop"]["stalls"]]

            def stall_gaps() -> list[tuple[GpuGap, Attribution]]:
                return [
                    (gap, a)
                    for gap, a in app.model.gaps_newest_first()
                    if a is not None and a.top is not None and a.top.cause == "runq_wait"
                    if any(gap.ts_ns < t1 and t0 < gap.end_ns for t0, t1 in stalls)
                ]

            await until(
                pilot,
                lambda: len({t0 for gap, _ in stall_gaps() for t0, t1 in stalls
                             if gap.ts_ns < t1 and t0 < gap.end_ns}) == 3,
                "the drill's three stalls, attributed",
                timeout=60,
            )  # fmt: skip
            await pilot.press("2")
            table = app.query_one("#gaps-table", GapsTable)
            rows = table_rows(table)
            assert sum("run-queue" in r for r in rows) >= 3, rows
            # A wait names its longest holder: outside load can outlast the hog in one.
            hog = [g for g, a in stall_gaps() if names_hog(a.top.evidence)]
            assert hog, [a.top for _, a in stall_gaps()]
            assert table.select_gap(hog[0].gap_id)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, GapScreen), "the breakdown")
            top = app.screen.attribution.top  # type: ignore[attr-defined]
            assert top.cause == "runq_wait", top
            assert names_hog(top.evidence), top.evidence

    asyncio.run(scenario())


def names_hog(evidence: tuple[Evidence, ...]) -> bool:
    return any(isinstance(e, TaskEvidence) and e.comm == "gj-drill-hog" for e in evidence)
