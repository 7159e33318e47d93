"""`gpujitter probe` and `record` fail (status 1) when none of the probes asked for could
run: the core module's status (`core`, its own BPF cost), which loads with any set, does not
count as one that ran."""

from __future__ import annotations

from gpujitter.cli.probe import exit_status
from gpujitter.probes.events import CORE_PROBE, ProbeStatus


def _status(probe: str, state: str) -> ProbeStatus:
    return ProbeStatus(ts_ns=1, probe=probe, state=state)  # type: ignore[arg-type]


def test_the_core_running_is_no_probe_that_ran() -> None:
    core = _status(CORE_PROBE, "running")
    gone = _status("python_gc", "unavailable")
    assert exit_status({s.probe: s for s in (core, gone)}) == 1
    ran = _status("sched", "running")
    assert exit_status({s.probe: s for s in (core, gone, ran)}) == 0
    assert exit_status({}) == 0
