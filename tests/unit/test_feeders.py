"""Which threads the probes' events name as feeders (probes/feeders.py): libcuda callers,
GIL waiters and holders, the wakers of feeders; forgotten once not named for KEEP_NS."""

from __future__ import annotations

from gpujitter.probes.events import CudaCall, GilWait, OffCpu
from gpujitter.probes.feeders import KEEP_NS, Feeders

S = 1_000_000_000


def _woke(tid: int, waker: int, ts_ns: int) -> OffCpu:
    return OffCpu(ts_ns=ts_ns, end_ns=ts_ns + 5_000_000, tid=tid, tgid=tid, cpu=0, cpu_in=0,
                  state="sleeping", runnable_ns=ts_ns + 4_000_000, waker_tid=waker)  # fmt: skip


def test_cuda_callers_gil_threads_and_wakers_of_feeders_are_feeders() -> None:
    f = Feeders()
    f.note(_woke(70, 71, S))  # 70 is no feeder yet: its waker is not one either
    f.note(CudaCall(ts_ns=S, dur_ns=0, tid=10, tgid=10, cpu=0, api="launch", func="cuLaunch",
                    after_idle_ns=S, prev_tid=11, prev_api="sync"))  # fmt: skip
    f.note(GilWait(ts_ns=S, dur_ns=2_000_000, tid=20, tgid=10, cpu=1, holder_tid=21))
    f.note(GilWait(ts_ns=S, dur_ns=2_000_000, tid=22, tgid=10, cpu=1))  # holder not known
    f.note(_woke(10, 30, 2 * S))  # a data-loader worker handing the launcher its batch
    assert f.recent(2 * S) == {10, 11, 20, 21, 22, 30}


def test_a_thread_not_named_for_keep_ns_is_forgotten() -> None:
    f = Feeders()
    f.note(GilWait(ts_ns=S, dur_ns=2_000_000, tid=20, tgid=10, cpu=1, holder_tid=21))
    f.note(GilWait(ts_ns=3 * S, dur_ns=2_000_000, tid=20, tgid=10, cpu=1))
    assert f.recent(S + KEEP_NS) == {20, 21}
    assert f.recent(S + KEEP_NS + 1) == {20}
    assert f.recent(3 * S + KEEP_NS + 1) == set()


def test_changes_count_threads_named_or_forgotten_not_named_again() -> None:
    """What python_stacks checks at every drain before it rewrites the kernel's feeder flags."""
    f = Feeders()
    f.note(GilWait(ts_ns=S, dur_ns=2_000_000, tid=20, tgid=10, cpu=1, holder_tid=21))
    assert f.changes == 2
    f.note(GilWait(ts_ns=2 * S, dur_ns=2_000_000, tid=20, tgid=10, cpu=1))
    f.recent(2 * S)
    assert f.changes == 2
    f.recent(S + KEEP_NS + 1)  # 21 forgotten, 20 named again since
    assert f.changes == 3
