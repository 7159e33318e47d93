"""The python_stacks probe on this kernel: samples of a running CPython process's innermost
function from the watched set (a feeder with no thread state, in any watched process, by its
native function), nothing for a sleeping one, and an interpreter it cannot read named once
in its status while it keeps sampling the others."""

from __future__ import annotations

import contextlib
import glob
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpujitter.probes import registry
from gpujitter.probes.events import NATIVE_LINE, CudaCall, Event, GilWait, PySample
from gpujitter.probes.progstats import enable_stats, prog_stats
from gpujitter.probes.python_stacks import BURST_SAMPLES, OTHERS_SHARE, PythonStacksProbe
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec
from tests import native_spin
from tests.proportion import proportional_tail

BUSY = "def spin_here():\n    while True:\n        pass\nprint(flush=True)\nspin_here()\n"
ASLEEP = "import time\nprint(flush=True)\ntime.sleep(60)\n"


def _start(exe: str, code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([exe, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def test_samples_running_threads_and_names_an_unreadable_interpreter_once() -> None:
    old = sorted(glob.glob("/root/.pyenv/versions/3.9*/bin/python3.9"))
    procs = [_start("/usr/bin/python3.11", BUSY), _start("/usr/bin/python3.11", ASLEEP)]
    if old:
        procs.append(_start(old[0], BUSY))
    events: list[Event] = []
    try:
        with ProbeSet(
            ["python_stacks"], topology=load_topology(),
            watch=WatchSpec(pids={p.pid for p in procs}), emit=lambda ev: events.append(ev),
        ) as probes:  # fmt: skip
            probes.start()
            probe = next(p for p in probes.probes if isinstance(p, PythonStacksProbe))
            for _ in range(10):
                time.sleep(0.1)
                probes.poll()
            probes.tick(time.monotonic_ns() + 2_000_000_000)
            reason = probe.reason
    finally:
        for p in procs:
            p.kill()
            p.wait()
    samples = [e for e in events if isinstance(e, PySample)]
    busy, asleep = procs[0].pid, procs[1].pid
    mine = [s for s in samples if s.tgid == busy]
    # ~100 Hz for 1 s on a busy 2-CPU VM: many, not all
    assert len(mine) >= 20, (len(mine), reason)
    assert {(s.tid, s.func, s.file, s.line) for s in mine} == {(busy, "spin_here", "<string>", 1)}
    assert not [s for s in samples if s.tgid == asleep]
    if old:
        assert "libpython3.9.so.1.0: CPython (3, 9): no frame layout known" in reason
        assert reason.count("CPython (3, 9)") == 1
    assert reason.startswith("sampling CPython 3.11"), reason


def test_watching_every_process_starts_though_some_cannot_be_read() -> None:
    """Regression: with every process watched, one whose /proc/PID/exe cannot be read (pid 1
    in this VM's container: EACCES even for root) made the probe unavailable."""
    with ProbeSet(
        ["python_stacks"], topology=load_topology(), watch=WatchSpec(all=True),
        emit=lambda ev: True,
    ) as probes:  # fmt: skip
        (status,) = probes.start()
    assert status.state == "running", status.reason


def test_many_busy_threads_share_one_budget_and_feeders_come_first() -> None:
    """Regression: every running watched thread was sampled at every tick, so the sampler's
    CPU grew with the number of busy threads (2.5-4.6 % of a CPU each). Six always-busy
    processes now share one budget (one sample per `spacing`), each by its CPU time; once a
    GIL wait names one of them (a feeder) it takes the budget first: every sample its CPU
    time offers (a third of a CPU here), the others a trickle.
    Regression too: the budget went to whichever timer fired once it had refilled, so equal
    CPU time drew 9 to 46 samples in CI (the timers' phases, not the CPU, set the shares)."""
    procs = [_start("/usr/bin/python3.11", BUSY) for _ in range(6)]
    feeder = procs[0].pid
    phases: dict[str, list[PySample]] = {"shared": [], "feeder": []}
    rounds = {"shared": 30, "feeder": 15}  # of 0.1 s: enough samples to tell the shares apart
    took: list[PySample] = []
    spacing_ns = registry.get("python_stacks").thresholds["spacing"]
    try:
        with ProbeSet(
            ["python_stacks"], topology=load_topology(),
            watch=WatchSpec(pids={p.pid for p in procs}),
            emit=lambda ev: took.append(ev) if isinstance(ev, PySample) else None,
        ) as probes:  # fmt: skip
            probes.start()
            probe = next(p for p in probes.probes if isinstance(p, PythonStacksProbe))
            while len(probe.interpreters) < len(procs):  # found once a second
                time.sleep(0.2)
                probes.tick(time.monotonic_ns())
            budget, elapsed, cpu = {}, {}, {}
            for phase, samples in phases.items():
                if phase == "feeder":  # named: counted from when the probe has heard of it
                    probes.ctx.emit(GilWait(ts_ns=time.monotonic_ns(), dur_ns=2_000_000,
                                            tid=feeder, tgid=feeder, cpu=0))  # fmt: skip
                probes.poll()
                took.clear()
                t0, cpu0 = time.monotonic_ns(), [_cpu_ns(p.pid) for p in procs]
                for _ in range(rounds[phase]):
                    if phase == "feeder":
                        gil = GilWait(ts_ns=time.monotonic_ns(), dur_ns=2_000_000,
                                      tid=feeder, tgid=feeder, cpu=0)  # fmt: skip
                        probes.ctx.emit(gil)
                    time.sleep(0.1)
                    probes.poll()
                samples.extend(took)
                elapsed[phase] = time.monotonic_ns() - t0
                cpu[phase] = [_cpu_ns(p.pid) - c for p, c in zip(procs, cpu0, strict=True)]
                budget[phase] = elapsed[phase] // spacing_ns + BURST_SAMPLES
    finally:
        for p in procs:
            p.kill()
            p.wait()
    shared = [sum(1 for s in phases["shared"] if s.tgid == p.pid) for p in procs]
    assert 0 < sum(shared) <= budget["shared"], (shared, budget)
    # each period of a thread's CPU is as likely as another to be sampled, so given their
    # total the counts are at most as spread as a multinomial draw in shares by CPU time
    # (less: the cap evens them out; bench/python_stacks_shares.py read tails of 0.5-0.997):
    # a tail under 1e-4 fails a correct sampler 1 run in 10 000 at most. CI's first-come
    # counts for equal CPU time, 23 23 46 17 9 30, have a tail of 5.5e-6.
    assert proportional_tail(shared, cpu["shared"]) >= 1e-4, (shared, cpu["shared"])
    fed = phases["feeder"]
    assert 0 < len(fed) <= budget["feeder"], (len(fed), budget)
    period_ns = registry.get("python_stacks").thresholds["period"]
    mine = sum(1 for s in fed if s.tgid == feeder)
    assert mine >= 0.8 * cpu["feeder"][0] // period_ns, (mine, cpu["feeder"])
    others = elapsed["feeder"] // (OTHERS_SHARE * spacing_ns) + BURST_SAMPLES
    assert len(fed) - mine <= others, (len(fed), mine, others)


SPIN = "def spin_here():\n    while True:\n        pass\nprint(flush=True)\nspin_here()\n"
PYENV = sorted(glob.glob("/root/.pyenv/versions/3.1[0-3]*/bin/python3.1[0-3]"))


@pytest.mark.parametrize("exe", ["/usr/bin/python3.11", *PYENV])
def test_the_kernels_walk_reads_every_supported_layout(exe: str) -> None:
    """Each version's layout as the BPF program walks it (3.10's frame objects, 3.11 and
    3.12 through the C frame, 3.13 from its debug offsets): the busy function, its file and
    first line, and one sample per period of the thread's CPU time at most."""
    proc = _start(exe, SPIN)
    took: list[PySample] = []
    period_ns = registry.get("python_stacks").thresholds["period"]
    try:
        with _sampling({proc.pid}, took) as probes:
            probes.poll()  # what was taken while the probe started
            took.clear()
            cpu0 = _cpu_ns(proc.pid)
            time.sleep(0.5)
            probes.poll()
            cpu_ns = _cpu_ns(proc.pid) - cpu0
    finally:
        proc.kill()
        proc.wait()
    assert {(s.tid, s.func, s.file, s.line) for s in took} == {
        (proc.pid, "spin_here", "<string>", 1)
    }
    assert 0.5 * cpu_ns / period_ns <= len(took) <= cpu_ns / period_ns + 2, (len(took), cpu_ns)


@contextlib.contextmanager
def _sampling(pids: set[int], took: list[PySample]) -> Iterator[ProbeSet]:
    """python_stacks started alone on `pids`, its samples appended to `took`."""
    with ProbeSet(
        ["python_stacks"], topology=load_topology(), watch=WatchSpec(pids=pids),
        emit=lambda ev: took.append(ev) if isinstance(ev, PySample) else None,
    ) as probes:  # fmt: skip
        probes.start()
        yield probes


def _cpu_ns(tid: int) -> int:
    """The CPU time a thread has run, from its schedstat (ns)."""
    with open(f"/proc/{tid}/schedstat") as f:
        return int(f.read().split()[0])


LATE_THREAD = """
import sys, threading
stop = []
def late_spin():
    while not stop:
        pass
print(flush=True)
sys.stdin.readline()
t = threading.Thread(target=late_spin)
t.start()
print(t.native_id, flush=True)
sys.stdin.readline()
stop.append(1)
t.join()
print(flush=True)
sys.stdin.readline()
"""


@contextlib.contextmanager
def _late_thread() -> Iterator[tuple[subprocess.Popen[str], ProbeSet, list[PySample], int]]:
    """A Python process running LATE_THREAD (talked to with _say) sampled alone: it, the
    probes, their samples, and the perf events this process held open before its late
    thread started. The process is killed at the end."""
    proc = subprocess.Popen(
        ["/usr/bin/python3.11", "-c", LATE_THREAD], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    took: list[PySample] = []
    try:
        _say(proc, None)
        with _sampling({proc.pid}, took) as probes:
            yield proc, probes, took, _open_fds()
    finally:
        proc.kill()
        proc.wait()


def _say(proc: subprocess.Popen[str], line: str | None = "") -> str:
    """Send `line` (None: nothing) to a child, then read its reply."""
    assert proc.stdin is not None and proc.stdout is not None
    if line is not None:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    return proc.stdout.readline()


def _end_thread(proc: subprocess.Popen[str], tid: int) -> None:
    """Tell LATE_THREAD's thread to end, and wait until the kernel has let its task go: the
    join returns once Python is done with the thread, but the task lives on a little (long
    beside a CPU hog), and a thread list read before it is gone still finds it."""
    _say(proc)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{proc.pid}/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.01)


def _open_fds() -> int:
    """Perf events this process holds open (the probe's one per thread among them)."""
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own)
            continue
    return fds.count("anon_inode:[perf_event]")


def test_a_thread_started_later_is_sampled_and_let_go_when_it_ends() -> None:
    """Thread lists are read once a second: a thread started after the probe is sampled from
    the next read on, and its perf event is closed at the read after it ended."""
    with _late_thread() as (proc, probes, took, fds_before):
        late = int(_say(proc))
        probes.tick(time.monotonic_ns() + 2_000_000_000)  # the next thread-list read
        assert _open_fds() == fds_before + 1
        time.sleep(0.3)
        probes.poll()
        _end_thread(proc, late)
        probes.tick(time.monotonic_ns() + 4_000_000_000)
        fds_after = _open_fds()
    assert {(s.tid, s.func) for s in took} == {(late, "late_spin")}, took[:5]
    assert fds_after == fds_before


def test_while_feeders_are_known_the_others_timers_stop_but_one() -> None:
    """Regression: every sampled thread's perf event stayed on, so each of its context
    switches stopped and started a timer (~1 us here) though the others get only a
    twentieth of the budget once a feeder is known. Now their events are off but one's (in
    turn, a second each): the program runs about as often as the feeder's and that one's
    CPU time has periods, where before it ran for every busy thread's."""
    procs = [_start("/usr/bin/python3.11", BUSY) for _ in range(4)]
    feeder = procs[0].pid
    period_ns = registry.get("python_stacks").thresholds["period"]
    took: list[PySample] = []
    stats_fd = enable_stats()
    runs: dict[str, int] = {}
    cpu: dict[str, list[int]] = {}
    try:
        with _sampling({p.pid for p in procs}, took) as probes:
            probe = next(p for p in probes.probes if isinstance(p, PythonStacksProbe))
            while len(probe.interpreters) < len(procs):  # found once a second
                time.sleep(0.2)
                probes.tick(time.monotonic_ns())
            for phase in ("all", "feeder"):
                if phase == "feeder":
                    probes.ctx.emit(GilWait(ts_ns=time.monotonic_ns(), dur_ns=2_000_000,
                                            tid=feeder, tgid=feeder, cpu=0))  # fmt: skip
                probes.poll()
                runs0, cpu0 = _runs(probe), [_cpu_ns(p.pid) for p in procs]
                time.sleep(1.0)
                runs[phase] = _runs(probe) - runs0
                cpu[phase] = [_cpu_ns(p.pid) - c for p, c in zip(procs, cpu0, strict=True)]
    finally:
        os.close(stats_fd)
        for p in procs:
            p.kill()
            p.wait()
    assert runs["all"] >= 0.7 * sum(cpu["all"]) // period_ns, (runs, cpu)
    on = cpu["feeder"][0] + max(cpu["feeder"][1:])
    assert runs["feeder"] <= on // period_ns + 3, (runs, cpu)


def _runs(probe: PythonStacksProbe) -> int:
    """How often the probe's BPF program has run (statistics on)."""
    return sum(prog_stats(fd).run_cnt for fd in probe.programs())


def test_a_thread_with_no_python_frame_is_named_by_its_native_function(tmp_path: Path) -> None:
    """A Python thread running only C code (no Python frame): its samples name the native
    function the thread was in and the library holding it, at line NATIVE_LINE; the main
    thread, asleep, has none."""
    lib = native_spin.build(tmp_path)
    proc, spinner = native_spin.start(lib)
    took: list[PySample] = []
    try:
        with _sampling({proc.pid}, took) as probes:
            probes.tick(time.monotonic_ns() + 2_000_000_000)  # found, its thread list read
            time.sleep(1.0)
            probes.poll()
    finally:
        proc.kill()
        proc.wait()
    assert len(took) >= 20, took[:5]
    assert {(s.tid, s.func, s.file, s.line) for s in took} == {
        (spinner, native_spin.SPIN_FUNC, str(lib), NATIVE_LINE)
    }, took[:5]


def test_a_feeder_with_no_thread_state_is_named_by_its_native_function(tmp_path: Path) -> None:
    """Regression: only threads in an interpreter's thread list were sampled, so a feeder
    that never took a thread state (here a libcuda caller in a process with no Python at
    all, as a C++ launcher is) had no sample and its host work named nothing. Now every
    sample of it names the C function it spins in and the program, at line NATIVE_LINE; the
    process's other thread, no feeder, is not sampled, and a Python feeder beside it is
    still sampled by its Python function."""
    exe = native_spin.build_program(tmp_path)
    proc, feeder, other = native_spin.start_program(exe)
    py = _start("/usr/bin/python3.11", BUSY)
    took: list[PySample] = []
    try:
        with _sampling({proc.pid, py.pid}, took) as probes:
            _feed_until(
                probes, [(feeder, proc.pid), (py.pid, py.pid)],
                lambda: min(sum(1 for s in took if s.tgid == p) for p in (proc.pid, py.pid)) >= 10,
            )  # fmt: skip
            probes.tick(time.monotonic_ns())
            reason = probes.probes[0].reason
    finally:
        for p in (proc, py):
            p.kill()
            p.wait()
    native = {(s.tid, s.func, s.file, s.line) for s in took if s.tgid == proc.pid}
    assert native == {(feeder, native_spin.FEEDER_FUNC, str(exe), NATIVE_LINE)}, took[:5]
    assert other not in {s.tid for s in took}
    python = {(s.tid, s.func, s.file, s.line) for s in took if s.tgid == py.pid}
    assert python == {(py.pid, "spin_here", "<string>", 1)}, took[:5]
    assert "feeders with no thread state (native frames): 1" in reason, reason


def _feed_until(probes: ProbeSet, feeders: list[tuple[int, int]], done: Callable[[], bool]) -> None:
    """Poll the probes, naming the threads `feeders` (tid, pid) libcuda callers every round,
    until done() or 20 s have passed (~1 s is enough on a busy 2-CPU VM)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not done():
        for tid, pid in feeders:
            probes.ctx.emit(CudaCall(ts_ns=time.monotonic_ns(), dur_ns=0, tid=tid, tgid=pid,
                                     cpu=0, api="launch", func="cuLaunchKernel"))  # fmt: skip
        time.sleep(0.2)
        probes.poll()


def test_a_native_only_feeder_becomes_a_python_thread_once_listed_and_is_let_go() -> None:
    """A feeder started since its process's thread list was read is in no list: it is
    sampled by its native frame, then, from the next read that lists it, by its Python
    function on the same perf event; once it has ended its event is closed (not opened
    again as a native-only one, though it is still named a feeder)."""
    with _late_thread() as (proc, probes, took, fds_before):
        late = int(_say(proc))
        _feed_until(probes, [(late, proc.pid)], lambda: any(s.tid == late for s in took))
        listed_ns = time.monotonic_ns()
        probes.tick(listed_ns + 2_000_000_000)  # the next thread-list read
        probes.poll()  # what was taken before it (the ring is drained at each poll)
        native = [s for s in took if s.ts_ns < listed_ns]
        fds_native = _open_fds()
        took.clear()
        _feed_until(probes, [(late, proc.pid)], lambda: len(took) >= 5)
        fds_python = _open_fds()
        told_ns = time.monotonic_ns()
        _end_thread(proc, late)
        probes.ctx.emit(CudaCall(ts_ns=time.monotonic_ns(), dur_ns=0, tid=late, tgid=proc.pid,
                                 cpu=0, api="launch", func="cuLaunchKernel"))  # fmt: skip
        probes.tick(time.monotonic_ns() + 4_000_000_000)
        probes.poll()
        fds_after = _open_fds()
    assert native and {(s.tid, s.line) for s in native} == {(late, NATIVE_LINE)}, native[:5]
    # Until it was told to end: on its way out the thread runs threading's own code, and the
    # main thread Python of its own, where a period of CPU time can end (CI under a hog)
    spinning = [s for s in took if s.ts_ns < told_ns]
    assert {(s.tid, s.func) for s in spinning} == {(late, "late_spin")}, [
        s for s in took if (s.tid, s.func) != (late, "late_spin")
    ]
    assert fds_native == fds_python == fds_before + 1
    assert fds_after == fds_before
