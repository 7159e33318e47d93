"""Real-kernel probe tests: attach probes to this kernel, generate exactly the jitter under
test, assert what the probes report."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpujitter.probes.events import Event, ProbeStatus
from gpujitter.probes.runner import ProbeThread
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.probes.watch import WatchSpec
from tests.kernel import soak_beside

pytestmark = pytest.mark.kernel

# These tests time real kernel events on a VM whose host takes a vCPU when it likes (for
# 0.1-1 ms between two programs on one tracepoint, seen in CI) and whose sandbox agent's
# switches are never traced: a rare run meets such a moment in a check made to the
# microsecond. A kernel test that fails runs once more and fails only if that run fails too;
# every first failure is listed at the end of the run (below), so a flake is still seen and
# a product bug that fails once in a while still shows there.
RERUNS = 1
_first_failures: list[tuple[str, str]] = []  # (test, its failure's one line)


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    soak_beside.plan_beside(config, items)
    here = Path(__file__).parent
    for item in items:  # every collected test: keep to this folder's
        if item.path.is_relative_to(here) and not item.get_closest_marker("flaky"):
            item.add_marker(pytest.mark.flaky(reruns=RERUNS))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun":  # pytest-rerunfailures' outcome
        crash = getattr(report.longrepr, "reprcrash", None)
        line = (getattr(crash, "message", "") or str(report.longrepr)).splitlines()
        _first_failures.append((report.nodeid, line[0][:300] if line else ""))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _first_failures:
        terminalreporter.section("kernel tests that failed once and ran again")
        for nodeid, line in _first_failures:
            terminalreporter.line(f"{nodeid}: {line}")


@pytest.fixture(scope="session", autouse=True)
def kernel_prerequisites() -> None:
    problems = []
    if os.geteuid() != 0:
        problems.append("not root")
    if not Path("/sys/kernel/tracing/events").is_dir():
        problems.append("tracefs not mounted at /sys/kernel/tracing")
    try:
        import bcc  # noqa: F401
    except ImportError:
        problems.append("bcc not importable")
    if problems:
        pytest.fail("kernel tests need " + ", ".join(problems) + " (run `make test` as root)")


class Recorded:
    """Events one probe run delivered, with helpers to pick them."""

    def __init__(self, events: list[Event], statuses: list[ProbeStatus]) -> None:
        self.events = events
        self.statuses = statuses

    def of(self, cls: type, **match: Any) -> list[Any]:
        return [
            e
            for e in self.events
            if isinstance(e, cls) and all(getattr(e, k) == v for k, v in match.items())
        ]

    def story(self, since_ns: int, **match: Any) -> str:
        """The matching events, one a line, times in ms from `since_ns`: for an assertion's
        message, where a rare failure must say what the probe saw."""
        lines = []
        for e in self.events:
            if all(getattr(e, k, None) == v for k, v in match.items()):
                fields = {f.name: getattr(e, f.name) for f in dataclasses.fields(e)}
                for k in ("ts_ns", "end_ns", "runnable_ns"):
                    if fields.get(k):
                        fields[k] = round((fields[k] - since_ns) / 1e6, 3)
                lines.append(f"{type(e).__name__} {fields}")
        return "\n".join(lines)

    def status(self, probe: str) -> ProbeStatus:
        return [
            s
            for s in self.statuses + self.events  # the latest last
            if isinstance(s, ProbeStatus) and s.probe == probe
        ][-1]


def cgroup_hierarchy() -> Path:
    """A cgroup hierarchy this process can make cgroups in and move processes into (the cpu
    controller's under cgroup v1, else the v2 one)."""
    found = next(
        (Path(p) for p in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")
         if (Path(p) / "cgroup.procs").exists()),
        None,
    )  # fmt: skip
    if found is None:
        pytest.fail("no writable cgroup hierarchy: CI runs as root with one")
    return found


def run_probes(
    names: Sequence[str],
    load: Callable[[], Any],
    *,
    watch: WatchSpec,
    thresholds: Mapping[str, Mapping[str, int]] | None = None,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    topology: Topology | None = None,
    settle_s: float = 0.3,
    tick_ms: int = 1000,
) -> Recorded:
    """Start the probes, run `load()` (which generates the jitter), let the ring buffers
    drain, stop. `watch` may be filled in by `load` before it starts its workload (e.g. a
    child pid), since the watched set is refreshed every second and on every exec."""
    events: list[Event] = []
    with ProbeThread(
        names,
        topology=topology or load_topology(),
        watch=watch,
        emit=events.append,
        thresholds=thresholds,
        options=options,
        tick_ms=tick_ms,
    ) as pt:
        load()
        time.sleep(settle_s)
    return Recorded(events, pt.statuses)
