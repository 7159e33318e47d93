"""The gap detector finds a thread's off-CPU intervals inside a sync by time, whatever order
they arrived in (the kept intervals are searched by bisection, not scanned per sync)."""

from __future__ import annotations

import pytest

from gpujitter.daemon.analysis.gaps import GapDetector
from gpujitter.probes.events import CudaCall, Event, OffCpu
from tests.fixtures.streams.synthetic import detect

MS = 1_000_000
PID = 4242


def off(start_ms: int, end_ms: int, runnable_ms: int, state: str = "sleeping") -> OffCpu:
    return OffCpu(ts_ns=start_ms * MS, end_ns=end_ms * MS, tid=PID, tgid=PID, cpu=0, cpu_in=0,
                  state=state, runnable_ns=runnable_ms * MS, other_tid=99, other_comm="hog")  # type: ignore[arg-type]  # fmt: skip


def woken_late(intervals: list[OffCpu]) -> list[Event]:
    """A sync from 100 to 200 ms, blocked and woken at 160 ms (the GPU's completion), then
    waiting on the run queue until 190 ms; the intervals arrive in the order given, all
    before the sync's return is reported (the sched probe's ring is polled first)."""
    sync = CudaCall(ts_ns=100 * MS, dur_ns=100 * MS, tid=PID, tgid=PID, cpu=0, api="sync",
                    func="cuStreamSynchronize", prev_tid=PID, prev_api="launch")  # fmt: skip
    return [*intervals, sync]


# Intervals of the thread around the sync: before it, the one in it that shows the wake-up,
# a preemption inside it, and one after it (these do not count: they lie outside the sync).
BEFORE, WOKEN, PREEMPTED, AFTER = (
    off(20, 40, 30),
    off(130, 190, 160),
    off(110, 112, 110, "preempted"),
    off(205, 230, 220),
)


@pytest.mark.parametrize(
    "order",
    [
        [BEFORE, PREEMPTED, WOKEN, AFTER],  # time order
        [AFTER, WOKEN, BEFORE, PREEMPTED],
        [WOKEN, PREEMPTED, AFTER, BEFORE],
    ],
)
def test_a_starved_sync_is_found_whatever_order_its_intervals_arrived_in(
    order: list[OffCpu],
) -> None:
    gaps = detect(woken_late(order))
    assert [(g.ts_ns, g.end_ns, "sched" in g.sources) for g in gaps] == [(160 * MS, 200 * MS, True)]


def test_intervals_past_the_bound_go_oldest_arrival_first() -> None:
    # Kept per thread: at most max_offcpu_per_thread, the earliest arrivals dropped first.
    # The wake-up arrived first of three with a bound of two: gone, the sync is not starved.
    from gpujitter.daemon.analysis.gaps import GapConfig

    detector = GapDetector(GapConfig(max_offcpu_per_thread=2))
    assert detect(woken_late([WOKEN, BEFORE, AFTER]), detector) == []
    detector = GapDetector(GapConfig(max_offcpu_per_thread=2))
    assert len(detect(woken_late([BEFORE, AFTER, WOKEN]), detector)) == 1
