"""The core BPF module: the watched set in the kernel (forks followed, execs matched at
once) and its life across probe sets in one process."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from gpujitter.errors import GpujitterError
from gpujitter.probes import watch
from gpujitter.probes.events import (
    AllocSyscall,
    ProbeStatus,
    ProcExec,
    ProcExit,
    ThreadExit,
    WatchChange,
    WorkloadInfo,
)
from gpujitter.probes.host import HostPaths
from gpujitter.probes.runner import ProbeSet, ProbeThread
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import ROOT_WALKS, WatchSpec
from tests.kernel.conftest import cgroup_hierarchy, run_probes
from tests.kernel.test_malloc import allocating_child

MAPS = 8
SIZE = 24 << 20  # a size nothing else on the node maps in these tests

# The parent waits for the go line, then forks a child that maps MAPS blocks of SIZE; the
# child's pid is printed so the test can look for its events.
FORKER = textwrap.dedent(f"""
    import mmap, os, sys
    sys.stdin.readline()
    pid = os.fork()
    if pid == 0:
        for _ in range({MAPS}):
            m = mmap.mmap(-1, {SIZE})
            m.close()
        os._exit(0)
    print(pid, flush=True)
    os.waitpid(pid, 0)
""")


def test_children_of_a_watched_process_are_watched_from_their_first_call() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    child_pid: list[int] = []

    def load() -> None:
        assert parent.stdin is not None and parent.stdout is not None
        parent.stdin.write("go\n")
        parent.stdin.flush()
        child_pid.append(int(parent.stdout.readline()))
        assert parent.wait(timeout=30) == 0

    rec = run_probes(
        ["malloc"], load, watch=WatchSpec(pids={parent.pid}), thresholds={"malloc": {"syscall": 0}}
    )
    maps = [
        e
        for e in rec.of(AllocSyscall, tgid=child_pid[0])
        if e.syscall == "mmap" and e.length == SIZE
    ]
    # The child never went through a user-space refresh: only the kernel's fork hook can
    # have watched it, and it did before the child's first mmap.
    assert len(maps) == MAPS


# A parent whose child exists before anything watches it (a job met already running, with its
# DataLoader workers): the child waits for the go line on the shared stdin, then maps.
EARLY_CHILD = textwrap.dedent(f"""
    import mmap, os, sys
    pid = os.fork()
    if pid == 0:
        sys.stdin.readline()
        for _ in range({MAPS}):
            mmap.mmap(-1, {SIZE}).close()
        os._exit(0)
    print(pid, flush=True)
    os.waitpid(pid, 0)
""")


def _early_child() -> tuple[subprocess.Popen[str], int]:
    """EARLY_CHILD started: the parent, and the pid of the child it forked at once."""
    parent = subprocess.Popen(
        [sys.executable, "-c", EARLY_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert parent.stdout is not None and parent.stdin is not None
    return parent, int(parent.stdout.readline())


def test_children_a_watched_process_had_before_the_probes_attached_are_watched() -> None:
    """Attached to a job already running, its DataLoader workers (forked before) went
    unwatched: a wait of the training thread on them then read as plain `blocked`."""
    parent, child = _early_child()

    def load() -> None:
        assert parent.stdin is not None
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.wait(timeout=30) == 0

    rec = run_probes(
        ["malloc"], load, watch=WatchSpec(pids={parent.pid}), thresholds={"malloc": {"syscall": 0}}
    )
    maps = [e for e in rec.of(AllocSyscall, tgid=child) if e.syscall == "mmap" and e.length == SIZE]
    assert len(maps) == MAPS


def test_a_watched_process_s_children_are_walked_at_its_first_refreshes_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The walk of a watched process's threads' children files (what it forked before it
    was watched) runs at the first ROOT_WALKS refreshes that choose it; from then on the
    fork hook follows its children (the tests above), and ten refreshes a second of a
    training process do not read its hundred threads' files each time."""
    roots: list[int] = []
    walk = watch._descendants

    def counted(paths: HostPaths, tgids: list[int]) -> set[int]:
        roots.extend(tgids)
        return walk(paths, tgids)

    monkeypatch.setattr(watch, "_descendants", counted)
    parent, child = _early_child()

    def load() -> None:
        time.sleep(1.0)  # ten refreshes
        assert parent.stdin is not None
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.wait(timeout=30) == 0

    rec = run_probes(["malloc"], load, watch=WatchSpec(pids={parent.pid}), tick_ms=100,
                     thresholds={"malloc": {"syscall": 0}})  # fmt: skip
    assert roots.count(parent.pid) == ROOT_WALKS
    maps = [e for e in rec.of(AllocSyscall, tgid=child) if e.syscall == "mmap" and e.length == SIZE]
    assert len(maps) == MAPS  # the child it had before is watched all the same


def test_a_process_matching_a_comm_pattern_is_watched_when_it_execs(tmp_path: Path) -> None:
    name = f"gj-exec-{os.getpid()}"
    # The kernel names a process after the file it executed: a link with a distinctive name
    # gives the exec event a comm the pattern matches. The script waits a little so that
    # its calls come after user space (polling every 50 ms) has added it.
    link = tmp_path / name
    link.symlink_to(sys.executable)
    script = (
        f"import mmap, time\ntime.sleep(0.5)\n"
        f"for _ in range({MAPS}):\n    mmap.mmap(-1, {SIZE}).close()\n"
    )
    children: list[subprocess.Popen[bytes]] = []

    def load() -> None:
        children.append(subprocess.Popen([str(link), "-c", script]))
        assert children[0].wait(timeout=30) == 0

    # No /proc scan after the one at start: only the exec record can add the process.
    rec = run_probes(
        ["malloc"],
        load,
        watch=WatchSpec(comms=[name]),
        thresholds={"malloc": {"syscall": 0}},
        tick_ms=60_000,
    )
    pid = children[0].pid
    assert rec.of(ProcExec, tgid=pid)
    # Added on its exec record, not by the once-a-second /proc scan.
    assert any(pid in w.added and w.reason == "exec" for w in rec.of(WatchChange))
    maps = [e for e in rec.of(AllocSyscall, tgid=pid) if e.syscall == "mmap" and e.length == SIZE]
    assert len(maps) == MAPS


# Starts THREADS short-lived threads one after another, then exits.
THREADS = 20
# join() returns before the thread's last instructions in the kernel: the exit of the last
# one could come after the main thread's on a busy CPU, when its process is no longer
# watched (the process's exit says it then). Its task gone from /proc first.
THREADER = textwrap.dedent(f"""
    import os, sys, threading, time
    sys.stdin.readline()
    for _ in range({THREADS}):
        t = threading.Thread(target=time.sleep, args=(0.001,))
        t.start()
        t.join()
    while len(os.listdir("/proc/self/task")) > 1:
        time.sleep(0.001)
    print(threading.get_native_id(), flush=True)
""")


def test_thread_and_process_exits_of_a_watched_process_are_said() -> None:
    """Once only whole-process exits were streamed, and not as a change of the watched set:
    the daemon kept dead threads in every status record, and clients never saw removals."""
    job = subprocess.Popen(
        [sys.executable, "-c", THREADER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )

    def load() -> None:
        assert job.stdin is not None and job.stdout is not None
        job.stdin.write("go\n")
        job.stdin.flush()
        job.stdout.readline()
        assert job.wait(timeout=30) == 0

    rec = run_probes(["sched"], load, watch=WatchSpec(pids={job.pid}), settle_s=0.5)
    ended = {e.tid for e in rec.of(ThreadExit, tgid=job.pid)}
    assert len(ended) == THREADS and job.pid not in ended
    assert rec.of(ProcExit, tgid=job.pid)
    assert any(job.pid in w.removed and w.reason == "exit" for w in rec.of(WatchChange))


BURST = 1500
# Starts BURST threads that end at once, then waits for their tasks to be gone.
BURSTER = textwrap.dedent(f"""
    import os, sys, threading
    sys.stdin.readline()
    threads = [threading.Thread(target=int) for _ in range({BURST})]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while len(os.listdir("/proc/self/task")) > 1:
        pass
    print("done", flush=True)
""")


def test_a_burst_of_exits_while_the_drain_is_held_up_is_not_lost() -> None:
    """Beside a job churning threads on a saturated node the daemon's drain came late and the
    core's ring (16 pages, ~580 records) lost 10,723 exits in 40 s, 72 % of them: the
    threads' state stayed in every reader for the history. Here the drain is held up by
    this process's GIL (the probe thread drains in Python) while a watched process's
    threads end."""
    job = subprocess.Popen(
        [sys.executable, "-c", BURSTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )

    def load() -> None:
        assert job.stdin is not None and job.stdout is not None
        interval = sys.getswitchinterval()
        sys.setswitchinterval(10.0)  # the probe thread waits for the GIL that long at most
        try:
            job.stdin.write("go\n")
            job.stdin.flush()
            held = time.monotonic() + 2.0
            while time.monotonic() < held:  # no call here lets the GIL go
                pass
        finally:
            sys.setswitchinterval(interval)
        assert job.stdout.readline() == "done\n"
        assert job.wait(timeout=30) == 0

    rec = run_probes(["sched"], load, watch=WatchSpec(pids={job.pid}), settle_s=0.5)
    assert len({e.tid for e in rec.of(ThreadExit, tgid=job.pid)}) == BURST
    assert rec.status("core").lost_kernel == 0


# Threads that end as fast as the process can start them, until it is killed.
CHURNER = textwrap.dedent("""
    import sys, threading
    sys.stdin.readline()
    while True:
        threads = [threading.Thread(target=int) for _ in range(100)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
""")


def test_a_ring_filled_faster_than_it_is_drained_leaves_the_loop_its_ticks_and_stop() -> None:
    """libbpf's consume reads a ring until it finds it empty: beside a job churning threads
    on a saturated node, the probe thread given a sliver of a CPU never found the core's so,
    and `gpujitter record -d 110s` ran on for over 15 minutes, its statuses and stop waiting
    behind the drain. Here the drain is slowed by its consumer (100 µs an exit's record,
    the churner's exits come faster): the loop still ticks every second, and a stop ends it
    while the churner runs on."""
    job = subprocess.Popen(
        [sys.executable, "-c", CHURNER], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    events: list = []

    def slow(ev: object) -> None:
        events.append(ev)
        if isinstance(ev, ThreadExit):  # a record of the core's ring
            until = time.perf_counter_ns() + 100_000
            while time.perf_counter_ns() < until:
                pass

    # Were the drain not cut, the test would wait on the churner: it is killed at 30 s.
    killer = threading.Timer(30.0, job.kill)
    killer.start()
    try:
        pt = ProbeThread(["sched"], topology=load_topology(nvml=False),
                         watch=WatchSpec(pids={job.pid}), emit=slow)  # fmt: skip
        with pt:
            assert job.stdin is not None
            job.stdin.write("go\n")
            job.stdin.flush()
            start = time.monotonic_ns()
            time.sleep(4.0)
            exits = sum(isinstance(e, ThreadExit) and e.tgid == job.pid for e in events)
            stopping = time.monotonic()
        stopped_s = time.monotonic() - stopping
        assert job.poll() is None, "the churner was killed before the stop: the drain hung"
    finally:
        killer.cancel()
        job.kill()
        job.wait()
    assert exits > 1000  # the churner did churn, and the drain read it
    ticks = [e for e in events if isinstance(e, ProbeStatus) and e.probe == "core"
             and start < e.ts_ns < start + 4_000_000_000]  # fmt: skip
    assert len(ticks) >= 3, f"{len(ticks)} statuses in 4 s of a drain that never empties"
    assert stopped_s < 3.0, f"the stop took {stopped_s:.1f} s"


def test_probe_sets_run_one_after_another_in_one_process() -> None:
    for _ in range(3):
        # Above glibc's largest dynamic mmap threshold (32 MiB): every call maps.
        child, load = allocating_child(4, 40 << 20)
        rec = run_probes(
            ["malloc"],
            load,
            watch=WatchSpec(pids={child.pid}),
            thresholds={"malloc": {"syscall": 0}},
        )
        assert rec.status("malloc").state == "running"
        assert (
            len(
                [
                    e
                    for e in rec.of(AllocSyscall, tgid=child.pid)
                    if e.syscall == "mmap" and e.length >= 40 << 20  # glibc adds a header page
                ]
            )
            == 4
        )


def test_the_core_s_programs_are_costed_as_core_and_in_no_probe() -> None:
    """The core's fork, exec and exit programs run for every process of the node, watched or
    not: their cost is the `core` meta.probe's, from programs that no probe of the module
    they share counts."""
    events: list = []
    with ProbeSet(["malloc", "irq"], topology=load_topology(nvml=False),
                  watch=WatchSpec(pids={os.getpid()}), emit=events.append) as probes:  # fmt: skip
        probes.start()
        core = set(probes.core.programs())
        assert core and all(core.isdisjoint(p.programs()) for p in probes.probes)
        for _ in range(20):
            subprocess.run(["true"], check=True)
        time.sleep(0.3)  # a stretch the meter measures (progstats.MIN_STRETCH_NS)
        probes.poll()
        probes.tick(time.monotonic_ns())
    status = [e for e in events if isinstance(e, ProbeStatus) and e.probe == "core"][-1]
    assert status.state == "running" and status.cost_from in ("bpf_stats", "sampled")
    assert status.bpf_runs_per_s > 0 and status.bpf_ns_per_s > 0, status
    assert status.events >= 20, status  # the execs, streamed whoever runs them


def test_a_second_probe_set_at_the_same_time_is_refused_in_one_line() -> None:
    kwargs = {
        "topology": load_topology(nvml=False),
        "watch": WatchSpec(pids={1}),
        "emit": lambda ev: True,
    }
    with ProbeThread(["malloc"], **kwargs), pytest.raises(GpujitterError) as err:
        ProbeThread(["malloc"], **kwargs).__enter__()
    assert "already running in this process" in str(err.value)


def test_a_slurm_jobs_processes_are_watched_and_announced_with_their_job(tmp_path: Path) -> None:
    """A process in a cgroup laid out as slurmstepd lays out its v1 job steps is chosen by
    --slurm-job and announced (meta.workload) with the job and step, as is its forked child."""
    job = f"9{os.getpid()}"
    step = cgroup_hierarchy() / "slurm" / "uid_0" / f"job_{job}" / "step_0"
    step.mkdir(parents=True)
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import os, time; os.fork() or time.sleep(3); time.sleep(3)"],
        preexec_fn=lambda: (step / "cgroup.procs").write_text(str(os.getpid())),
    )
    try:
        rec = run_probes(
            ["sched"], lambda: time.sleep(2.5), watch=WatchSpec(slurm_jobs=[job]), settle_s=0
        )
    finally:
        # Only this test's processes are in its step: the sleeper and its child.
        for pid in (step / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        sleeper.wait()
        deadline = time.monotonic() + 5
        while (step / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)  # the child is reaped by init, not by us
        for d in (step, step.parent, step.parent.parent, step.parent.parent.parent):
            with contextlib.suppress(OSError):  # another job's directories stay
                d.rmdir()
    infos = [e for e in rec.events if isinstance(e, WorkloadInfo)]
    assert sleeper.pid in {e.tgid for e in infos} and len({e.tgid for e in infos}) == 2
    assert {(e.workload.kind, e.workload.slurm_job, e.workload.slurm_step) for e in infos} == {
        ("slurm", job, "0")
    }


# The main thread waits for the go line, then a second thread execs (the kernel retires the
# leader, the process goes on under its id as `sleep`), or the main thread leaves first
# (pthread_exit) and the second thread ends the process half a second later.
LEADER_FIRST = textwrap.dedent("""
    import os, sys, threading, time
    sys.stdin.readline()
    if sys.argv[1] == "exec":
        threading.Thread(target=os.execv, args=("/bin/sleep", ["sleep", "1.5"])).start()
        time.sleep(30)
    else:
        threading.Thread(target=lambda: (time.sleep(0.5), os._exit(0))).start()
        import ctypes
        ctypes.CDLL(None).pthread_exit(None)
""")


@pytest.mark.parametrize("how", ["exec", "pthread_exit"])
def test_a_leader_that_goes_first_is_no_process_exit(how: str) -> None:
    """The leader's exit was taken for the process's: an exec from another thread said
    "pid N exited" of a process running on under its id (unwatched until the next refresh,
    and its real exit never said), found by the field audit."""
    job = subprocess.Popen([sys.executable, "-c", LEADER_FIRST, how], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)  # fmt: skip

    def load() -> None:
        assert job.stdin is not None
        job.stdin.write("go\n")
        job.stdin.flush()
        time.sleep(0.8)
        assert job.poll() is None or how == "pthread_exit"  # execed: still running
        assert job.wait(timeout=30) == 0

    rec = run_probes(["sched"], load, watch=WatchSpec(pids={job.pid}), settle_s=0.5)
    exits = rec.of(ProcExit, tgid=job.pid)
    assert len(exits) == 1  # the process's end, once
    removed = [w for w in rec.of(WatchChange) if job.pid in w.removed]
    assert [w.reason for w in removed] == ["exit"]
    if how == "exec":  # it ended 1.5 s after the exec, not at it
        execed = rec.of(ProcExec, tgid=job.pid)
        assert execed and exits[0].ts_ns - execed[0].ts_ns > 1_000_000_000
    else:  # the leader's exit is a thread's; the process ended half a second later
        leader = [e for e in rec.of(ThreadExit, tgid=job.pid) if e.tid == job.pid]
        assert leader and exits[0].ts_ns - leader[0].ts_ns > 300_000_000
