"""The daemon's node state: which watched threads it keeps (for status records and the TUI's
placement view) as threads and processes come and go."""

from __future__ import annotations

from gpujitter.daemon.service.state import NodeState
from gpujitter.daemon.service.status import ProbeCost
from gpujitter.probes.events import OffCpu, ProbeStatus, ProcExit, ThreadExit
from gpujitter.probes.topology import Topology


def ran(ts_ns: int, tid: int, tgid: int, cpu: int = 1) -> OffCpu:
    return OffCpu(
        ts_ns=ts_ns, end_ns=ts_ns + 10, tid=tid, tgid=tgid, cpu=0, cpu_in=cpu,
        state="sleeping", runnable_ns=ts_ns + 5, comm="worker",
    )  # fmt: skip


def tids(state: NodeState) -> list[int]:
    return [t.tid for t in state.status(0).threads]


def state() -> NodeState:
    return NodeState(Topology(cpu_node={0: 0, 1: 0}))


def test_an_ended_thread_leaves_the_status_and_late_news_of_it_does_not_bring_it_back() -> None:
    s = state()
    s.observe(ran(100, tid=11, tgid=10))
    s.observe(ran(110, tid=12, tgid=10))
    s.observe(ThreadExit(ts_ns=200, tgid=10, tid=11))
    assert tids(s) == [12]
    # The sched ring is read after the core's: an off-CPU interval from before the exit
    # arrives after it.
    s.observe(ran(150, tid=11, tgid=10))
    assert tids(s) == [12]
    # The same id, reused by a new thread later, is a thread again.
    s.observe(ran(300, tid=11, tgid=10))
    assert tids(s) == [11, 12]


def test_a_process_exit_takes_all_its_threads() -> None:
    s = state()
    for tid in (21, 22, 23):
        s.observe(ran(100, tid=tid, tgid=21))
    s.observe(ran(100, tid=31, tgid=31))
    s.observe(ProcExit(ts_ns=200, tgid=21, comm="job"))
    s.observe(ran(190, tid=22, tgid=21))
    assert tids(s) == [31]


def test_thousands_of_short_lived_children_leave_nothing_behind() -> None:
    """Once: 303 dead threads in every status record, and after 6,000 short-lived children
    the 4,096 cap (295 KB per status record, every second, to every client)."""
    s = state()
    s.observe(ran(1, tid=1, tgid=1))
    for child in range(1000, 7000):
        s.observe(ran(child * 10, tid=child, tgid=1))  # a thread of the job
        s.observe(ThreadExit(ts_ns=child * 10 + 5, tgid=1, tid=child))
        s.observe(ran(child * 10 + 1, tid=child + 10_000, tgid=child + 10_000))  # a child
        s.observe(ProcExit(ts_ns=child * 10 + 6, tgid=child + 10_000, comm="sh"))
    assert tids(s) == [1]


def test_each_probe_says_what_it_costs_in_the_status() -> None:
    node = state()
    node.observe(ProbeStatus(ts_ns=1, probe="sched", state="running", events=7, lost_kernel=1,
                              bpf_ns_per_s=2_000_000, bpf_runs_per_s=30_000,
                              cost_from="sampled"))  # fmt: skip
    node.observe(ProbeStatus(ts_ns=1, probe="cuda", state="degraded"))
    cost = node.probe_cost()
    assert cost["sched"] == ProbeCost(
        state="running", bpf_ns_per_s=2_000_000, bpf_runs_per_s=30_000, cost_from="sampled",
        events=7, lost_kernel=1, lost_user=0,
    )  # fmt: skip
    assert cost["cuda"].bpf_ns_per_s == -1 and cost["cuda"].cost_from == ""


def test_threads_that_exited_unseen_are_forgotten_by_asking_the_node() -> None:
    """With every process watched no exit is streamed: 5,000 short-lived threads filled the
    status with 4,096 entries, 17 of them alive (250 KB a second to every client)."""
    s = state()
    for tid in range(100, 5100):
        s.observe(ran(tid, tid=tid, tgid=tid))
    living = {4000, 4500, 5099}
    asked: list[int] = []

    def alive(tid: int) -> bool:
        asked.append(tid)
        return tid in living

    assert len(tids(s)) == 4096
    assert s.forget_gone(alive, budget=256) == 256 and len(asked) == 256
    while len(tids(s)) > len(living):
        s.forget_gone(alive, budget=256)
    assert tids(s) == sorted(living)
    # those alive go to the back: each call asks about others, and they keep their place
    asked.clear()
    s.observe(ran(6000, tid=6000, tgid=6000))
    living.add(6000)
    s.forget_gone(alive, budget=2)
    assert asked == [4000, 4500]
    assert tids(s) == [4000, 4500, 5099, 6000]


def test_a_live_thread_is_alive_and_one_that_ended_is_not() -> None:
    import os
    import threading
    import time

    from gpujitter.probes.host import HostPaths
    from gpujitter.probes.procfs import alive

    def _alive(tid: int) -> bool:
        return alive(HostPaths(), tid)

    t = threading.Thread(target=lambda: None)
    t.start()
    t.join()
    assert t.native_id is not None
    assert _alive(threading.get_native_id()) and _alive(os.getpid())
    # join() returns as Python's side of the thread ends, a moment before the kernel's does
    deadline = time.monotonic() + 5
    while _alive(t.native_id) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert not _alive(t.native_id)
