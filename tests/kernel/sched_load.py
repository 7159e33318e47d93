"""Workloads for the sched and cstate probe tests: child processes that wait until the probes
watch them, run a scripted piece of scheduling behaviour and report what they measured
themselves (times, thread ids, kernel schedstat) as JSON; and a raw event log, to check a
probe against what the same tracepoints reported."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PRELUDE = """
import json, os, sys, threading, time
def pin(cpu):
    os.sched_setaffinity(0, {cpu})
def spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
def schedstat():
    # on-CPU ns, run-queue wait ns, timeslices: the kernel's own accounting of this thread
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
        return [int(v) for v in f.read().split()]
out = {"tid": threading.get_native_id(), "comm": open("/proc/self/comm").read().strip()}
"""


class Child:
    """A Python child running `body` (with PRELUDE's helpers, filling the dict `out`) once
    `load()` releases it; `load()` returns when it exited, with `out` in `self.result`.
    Leaving a `with Child(...)` block kills it if it still runs."""

    def __init__(self, body: str) -> None:
        script = PRELUDE + "sys.stdin.readline()\n" + textwrap.dedent(body)
        script += "\nprint(json.dumps(out), flush=True)\n"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        self.result: dict[str, Any] = {}

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait(self) -> dict[str, Any]:
        stdout, _ = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, stdout
        self.result = json.loads(stdout)
        return self.result

    def load(self) -> None:
        self.go()
        self.wait()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def together(*children: Child) -> Callable[[], None]:
    """A load that releases the children at once and returns when all have exited."""

    def load() -> None:
        for child in children:
            child.go()
        for child in children:
            child.wait()

    return load


@contextlib.contextmanager
def unwatched(
    cpu: int, name: str, body: str, *, fifo_priority: int = 0, pass_fds: tuple[int, ...] = ()
) -> Iterator[subprocess.Popen[bytes]]:
    """An unwatched process named `name` on `cpu` running `body` (Python, with os and time
    imported) for the block; SCHED_FIFO with a priority."""
    code = f"""
import os, time
os.sched_setaffinity(0, {{{cpu}}})
if {fifo_priority}:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param({fifo_priority}))
with open("/proc/self/comm", "w") as f:
    f.write({name!r})
"""
    proc = subprocess.Popen([sys.executable, "-c", code + textwrap.dedent(body)], pass_fds=pass_fds)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def hog(
    cpu: int, name: str, *, fifo_priority: int = 0, busy_s: float = 0.0
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """An unwatched process named `name` on `cpu` for the block: spinning, or with `busy_s`,
    spinning busy_s and sleeping as long in turn; SCHED_FIFO with a priority."""
    body = f"""
    while True:
        end = time.monotonic() + {busy_s}
        while time.monotonic() < end or not {busy_s}:
            pass
        time.sleep({busy_s})
    """
    return unwatched(cpu, name, body, fifo_priority=fifo_priority)


def idle_ticks() -> dict[int, int]:
    """Per CPU: idle + iowait time from /proc/stat, in USER_HZ ticks."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            out[int(name[3:])] = int(fields[3]) + int(fields[4])
    return out


def quietest_cpu(window_s: float = 0.3) -> int:
    """The CPU that idled most over the last moment: where a test that needs idle time
    has the best chance on a machine shared with other work."""
    before = idle_ticks()
    time.sleep(window_s)
    after = idle_ticks()
    return max(after, key=lambda cpu: after[cpu] - before[cpu])


@dataclass(frozen=True, slots=True)
class Logged:
    """One event the recorder saw: an idle-state entry (state), its exit, a switch, or a
    wake-up (sleep_log's)."""

    ts_ns: int
    kind: str  # "entry", "exit", "switch" or "waking"
    state: int = 0
    prev_pid: int = 0
    next_pid: int = 0


# The kernel's own tracer cannot serve here: on this kernel ftrace and perf counting miss
# most events raised by the idle task (power:cpu_idle, switches away from idle), which BPF
# programs do see. So the ground truth is a second, deliberately naive BPF program that
# logs every raw event on one CPU for the test to recompute from.
_RECORDER_BASE = r"""
struct logged { u64 ts_ns; u32 kind; u32 a; u32 b; };
BPF_RINGBUF_OUTPUT(logged, 4096);
BPF_ARRAY(dropped, u64, 1);
static __always_inline int put(u32 kind, u32 a, u32 b)
{
#ifdef CPU
    if (bpf_get_smp_processor_id() != CPU)
        return 0;
#endif
    struct logged *e = logged.ringbuf_reserve(sizeof(*e));
    if (!e) {
        dropped.increment(0);
        return 0;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->kind = kind;
    e->a = a;
    e->b = b;
    logged.ringbuf_submit(e, 0);
    return 0;
}
"""
RECORDER = (
    _RECORDER_BASE
    + r"""
TRACEPOINT_PROBE(power, cpu_idle)
{
    return put(args->state == 0xffffffff ? 1 : 0, args->state, 0);
}
TRACEPOINT_PROBE(sched, sched_switch) { return put(2, args->prev_pid, args->next_pid); }
"""
)
# Idle entries and exits alone, from the raw tracepoint. A tracepoint calls its raw programs
# in the order they were attached (perf tracepoint programs, RECORDER's, all at the place of
# the first one), so two of these, attached before a probe's program and after it, stamp
# every event on either side of the probe's stamp, whatever the host takes between programs.
IDLE_STAMPER = (
    _RECORDER_BASE
    + r"""
/* cpu_idle(unsigned int state, unsigned int cpu_id) */
RAW_TRACEPOINT_PROBE(cpu_idle)
{
    u32 state = (u32)ctx->args[0];
    return put(state == 0xffffffff ? 1 : 0, state, 0);
}
"""
)
# The switches of one thread (PID), on every CPU.
SWITCHES_OF = (
    _RECORDER_BASE
    + r"""
TRACEPOINT_PROBE(sched, sched_switch)
{
    if (args->prev_pid != PID && args->next_pid != PID)
        return 0;
    return put(2, args->prev_pid, args->next_pid);
}
"""
)
# The sleeps of one thread (PID), on every CPU: its switches away asleep (S or D in the
# tracepoint's prev_state; not a preemption's R+), its switches in and its wake-ups.
SLEEPS_OF = (
    _RECORDER_BASE
    + r"""
TRACEPOINT_PROBE(sched, sched_switch)
{
    if (args->next_pid != PID && (args->prev_pid != PID || !(args->prev_state & 0x3)))
        return 0;
    return put(2, args->prev_pid, args->next_pid);
}
TRACEPOINT_PROBE(sched, sched_waking) { return args->pid == PID ? put(3, 0, 0) : 0; }
"""
)
_KINDS = ("entry", "exit", "switch", "waking")


def untraced_switch_ins(log: list[Logged], pid: int) -> int:
    """How often `pid` left the logged CPU without a traced switch onto it: the kernel does
    not trace every switch (on this VM, none away from its PID-1 agent's threads,
    docs/probes.md), and what a probe measures at a switch-in is missing for those."""
    current = None
    missed = 0
    for e in log:
        if e.kind != "switch":
            continue
        missed += e.prev_pid == pid and current not in (None, pid)
        current = e.next_pid
    return missed


def unwoken_sleeps(log: list[Logged], pid: int) -> int:
    """How many sleeps of `pid` (in a sleep_log) ended in a traced switch onto it with no
    wake-up traced since it went to sleep: the kernel does not trace every wake-up either
    (on this VM, a timer's wake-up now and then, test_cstate.py), and what a probe measures
    from a wake-up is missing for those. A sleep whose switch-in was not traced is left to
    untraced_switch_ins."""
    asleep = woken = False
    missed = 0
    for e in log:
        if e.kind == "waking":
            woken = True
        elif e.prev_pid == pid:
            asleep, woken = True, False
        elif e.next_pid == pid:
            missed += asleep and not woken
            asleep = False
    return missed


def unseen_off_cpu(log: list[Logged], pid: int) -> list[tuple[int, int]]:
    """Per off-CPU interval of `pid` (in a log of its CPU, or a switch_log) that ended in a
    switch the kernel did not trace (untraced_switch_ins): its traced switch-out and the
    next one, which bound it (it ended in between, before a stint on CPU)."""
    spans = []
    out_ns = None
    for e in log:
        if e.kind != "switch":
            continue
        if e.next_pid == pid:
            out_ns = None
        if e.prev_pid == pid:
            if out_ns is not None:
                spans.append((out_ns, e.ts_ns))
            out_ns = e.ts_ns
    return spans


def held_within(log: list[Logged], pid: int, t0_ns: int, t1_ns: int) -> int:
    """How long `pid` held the logged CPU inside [t0_ns, t1_ns]: from each traced switch onto
    it to the CPU's next traced switch, clipped to the window."""
    switches = [e for e in log if e.kind == "switch"]
    return sum(
        max(0, min(b.ts_ns, t1_ns) - max(a.ts_ns, t0_ns))
        for a, b in itertools.pairwise(switches)
        if a.next_pid == pid
    )


def idle_log(
    cpu: int, recorder: str = RECORDER
) -> contextlib.AbstractContextManager[Callable[[], list[Logged]]]:
    """Log idle-state entries, exits and context switches of `cpu` for the block (only the
    first two with IDLE_STAMPER); yields a function that returns them (in order) and checks
    that none was dropped."""
    return _recording(recorder, f"-DCPU={cpu}")


def switch_log(pid: int) -> contextlib.AbstractContextManager[Callable[[], list[Logged]]]:
    """Log the context switches of thread `pid` on every CPU for the block, as idle_log."""
    return _recording(SWITCHES_OF, f"-DPID={pid}")


def sleep_log(pid: int) -> contextlib.AbstractContextManager[Callable[[], list[Logged]]]:
    """Log the sleeps of thread `pid` on every CPU for the block (SLEEPS_OF), as idle_log."""
    return _recording(SLEEPS_OF, f"-DPID={pid}")


@contextlib.contextmanager
def _recording(recorder: str, define: str) -> Iterator[Callable[[], list[Logged]]]:
    from bcc import BPF

    bpf = BPF(text=recorder, cflags=[define])
    try:
        out: list[Logged] = []

        def on_event(_ctx: Any, data: int, _size: int) -> int:
            e = bpf["logged"].event(data)
            if e.kind == 2:
                out.append(Logged(e.ts_ns, "switch", prev_pid=e.a, next_pid=e.b))
            else:
                out.append(Logged(e.ts_ns, _KINDS[e.kind], state=e.a))
            return 0

        bpf["logged"].open_ring_buffer(on_event)

        def logged() -> list[Logged]:
            bpf.ring_buffer_consume()
            assert bpf["dropped"][0].value == 0, "the log overflowed"
            out.sort(key=lambda e: e.ts_ns)  # one ring for every CPU: reserved in about that order
            return out

        yield logged
    finally:
        bpf.cleanup()
