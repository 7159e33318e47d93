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


def hog_wait(tid: int, at_ms: int) -> OffCpu:
    """A 2 ms preemption, all of it on the run queue."""
    return OffCpu(ts_ns=at_ms * MS, end_ns=(at_ms + 2) * MS, tid=tid, tgid=PID, cpu=0,
                  cpu_in=0, state="preempted", runnable_ns=at_ms * MS, other_tid=99,
                  other_comm="hog")  # fmt: skip


def test_a_thread_that_never_syncs_keeps_its_intervals_only_briefly() -> None:
    # Only a thread's own syncs read its intervals. A process of thousands of threads that
    # never sync kept each one's for the whole history (60 s): ~470 MB at 20k a second.
    from gpujitter.daemon.analysis.gaps import GapConfig

    cfg = GapConfig(offcpu_unsynced_ns=5_000 * MS)
    detector = GapDetector(cfg)
    syncer, other, quiet = PID, PID + 1, PID + 2
    sync = CudaCall(ts_ns=1 * MS, dur_ns=2 * MS, tid=syncer, tgid=PID, cpu=0, api="sync",
                    func="cuStreamSynchronize", prev_tid=syncer, prev_api="launch")  # fmt: skip
    detector.feed(sync)
    detector.feed(hog_wait(quiet, 10))
    for at_ms in range(10, 20_000, 10):
        detector.feed(hog_wait(syncer, at_ms))
        detector.feed(hog_wait(other, at_ms))
    assert len(detector.offcpu[syncer]) == 1999  # the whole history (60 s): all of them
    assert len(detector.offcpu[other]) == 501  # those ending in the last 5 s (bounds in)
    assert len(detector.offcpu[quiet]) == 1  # its last few stay: a first sync's own
    # Once the syncing thread's last sync is past the history, it is kept as briefly.
    detector.feed(hog_wait(other, 65_000))
    assert syncer not in detector.syncing
    assert quiet not in detector.offcpu  # past the history: swept, though it never added again
    detector.feed(hog_wait(syncer, 65_010))
    assert len(detector.offcpu[syncer]) == cfg.offcpu_unsynced_last  # the new one and 7 more


def test_a_first_sync_reported_after_the_intervals_inside_it_still_finds_them() -> None:
    # The thread's first sync: its intervals came in while it was unknown as a syncing one,
    # a poll (here a second of other threads' intervals) before the sync's own record.
    later = [hog_wait(PID + 1, at_ms) for at_ms in range(230, 1_230, 10)]
    gaps = detect([WOKEN, *later, woken_late([])[0]])
    assert [(g.ts_ns, g.end_ns, "sched" in g.sources) for g in gaps] == [(160 * MS, 200 * MS, True)]


def test_a_first_sync_longer_than_the_unsynced_window_keeps_its_wake_up() -> None:
    # A thread's first sync in the history, 8.1 s long: woken at 3.0 s (the GPU's
    # completion), then preempted until 8.99 s. Its record comes at its return; the wake-up
    # ended 5 s before, past offcpu_unsynced_ns, and was forgotten: no gap. A thread in a
    # sync does nothing else: its last few intervals are what the sync reads.
    def at(start_ms: int, end_ms: int, runnable_ms: int, state: str, tid: int = PID) -> OffCpu:
        return OffCpu(ts_ns=start_ms * MS, end_ns=end_ms * MS, tid=tid, tgid=PID, cpu=0,
                      cpu_in=0, state=state, runnable_ns=runnable_ms * MS,  # type: ignore[arg-type]
                      other_tid=99, other_comm="hog")  # fmt: skip

    others = [hog_wait(PID + 1, ms) for ms in range(1_000, 9_000, 100)]
    sync = CudaCall(ts_ns=900 * MS, dur_ns=8_100 * MS, tid=PID, tgid=PID, cpu=0, api="sync",
                    func="cuStreamSynchronize", prev_tid=PID, prev_api="launch")  # fmt: skip
    intervals = [at(1_000, 3_900, 3_000, "sleeping"), *others, at(3_900, 8_990, 3_900, "preempted")]
    gaps = detect([*sorted(intervals, key=lambda e: e.end_ns), sync])  # as they end, then it
    assert [(g.ts_ns, g.end_ns, "sched" in g.sources) for g in gaps] == [
        (3_000 * MS, 9_000 * MS, True)
    ]
