"""Every streamed record is accounted for: a generator's system calls, each one a malloc
record (threshold 0), come out as received, lost in the kernel or dropped in Python, with
nothing missing. CI-sized (20k records); the 100k/s figure is bench/event_rate.py's."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from bench.event_rate import account, build_generator, run_generator, start_generator
from gpujitter.daemon.service.runtime import EventQueue
from gpujitter.probes.base import Emit
from gpujitter.probes.events import AllocSyscall, Event, ProbeStatus
from gpujitter.probes.runner import ProbeThread
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

CALLS = 20_000
QUEUED = 5_000  # the event queue's bound: nothing drains it, so the rest is dropped


def _streaming(gen: subprocess.Popen[str], emit: Emit, **periods: int) -> ProbeThread:
    """The malloc probe watching the generator, every system call of it a record."""
    return ProbeThread(
        ["malloc"],
        topology=load_topology(nvml=False),
        watch=WatchSpec(pids={gen.pid}),
        emit=emit,
        thresholds={"malloc": {"syscall": 0}},
        **periods,
    )


def test_generated_records_are_received_lost_or_dropped_and_each_counted(tmp_path: Path) -> None:
    gen = start_generator(build_generator(tmp_path), rate=20_000, seconds=CALLS / 20_000)
    queue = EventQueue(maxsize=QUEUED)
    statuses: list[Event] = []

    def emit(ev: Event) -> bool:
        if isinstance(ev, ProbeStatus):  # kept apart: a full queue would refuse them too
            statuses.append(ev)
            return True
        return queue.emit(ev)

    try:
        with _streaming(gen, emit, tick_ms=100):
            generated, _ = run_generator(gen)
            time.sleep(1.0)  # ticks after the last record: the last status counts them all
    finally:
        if gen.poll() is None:
            gen.kill()
            gen.wait()
    received = list(queue.drain(limit=QUEUED + 1))
    result = account(generated, gen.pid, received + statuses)
    assert generated == CALLS
    assert result["dropped_python"] > 0  # the queue's drops of this probe's records
    assert result["unaccounted"] == 0, result
    assert result["probe_events"] == result["received"] + result["dropped_python"]


def _arrivals(tmp_path: Path, calls: int, rate: int, wait_s: float) -> list[float]:
    """When the records of `calls` streamed system calls were handed over by a probe thread
    whose drains are 30 s apart: seconds from the generator's end (negative: before it),
    for those handed over up to wait_s after it."""
    gen = start_generator(build_generator(tmp_path), rate=rate, seconds=calls / rate)
    arrived: list[float] = []

    def emit(ev: Event) -> bool:
        if not isinstance(ev, ProbeStatus):
            arrived.append(time.monotonic())
        return True

    try:
        with _streaming(gen, emit, poll_ms=30_000, tick_ms=30_000):
            time.sleep(0.5)  # past the start's drain and first tick
            arrived.clear()
            generated, _ = run_generator(gen)
            done = time.monotonic()
            assert generated == calls
            time.sleep(wait_s)
            return [t - done for t in arrived if t - done <= wait_s]
    finally:
        if gen.poll() is None:
            gen.kill()
            gen.wait()


def test_a_burst_wakes_the_drain_before_its_period(tmp_path: Path) -> None:
    """Records wait in the kernel for the next drain, except that the 256th since the last
    one wakes it (gj_wake_flags): a burst is handed over at once, and a trickle is not (a
    wake-up per record would be the cost the timer exists to avoid)."""
    assert not _arrivals(tmp_path, calls=100, rate=50_000, wait_s=2.0)
    burst = _arrivals(tmp_path, calls=2_000, rate=50_000, wait_s=1.0)
    assert burst and burst[0] < 1.0


def test_a_stream_keeps_waking_the_drain(tmp_path: Path) -> None:
    """A stream of records wakes every drain, not only the first: the count is zeroed once
    a drain is over, so a wake-up spent during it (on records the drain then took) is not
    the last. Zeroed as the drain began, the stream waited out the 30 s period after its
    first few hundred records."""
    stream = _arrivals(tmp_path, calls=100_000, rate=100_000, wait_s=1.0)
    assert sum(1 for t in stream if t < 0) > 50_000, len(stream)


def test_a_drain_hands_its_records_to_the_waiting_consumer(tmp_path: Path) -> None:
    """After each drain the probe thread says it handed a batch over, and the daemon's
    queue ends its consumer's wait on that: the consumer wakes behind the drain, not on a
    clock of its own. Here the consumer's wait is 20 s and the 100 records are far below the
    quarter of the bound that would end it early: only the hand-over can."""
    gen = start_generator(build_generator(tmp_path), rate=1_000, seconds=0.1)
    queue = EventQueue(maxsize=QUEUED)

    def emit(ev: Event) -> bool:
        return isinstance(ev, ProbeStatus) or queue.emit(ev)

    try:
        with _streaming(gen, emit, handed=queue.handed, poll_ms=200, tick_ms=30_000):
            time.sleep(0.5)  # past the start's drain
            queue.drain()
            generated, _ = run_generator(gen)
            done = time.monotonic()
            taken = queue.drain(timeout_s=20)
            waited = time.monotonic() - done
    finally:
        if gen.poll() is None:
            gen.kill()
            gen.wait()
    brk = [ev for ev in taken if isinstance(ev, AllocSyscall) and ev.syscall == "brk"]
    assert generated == 100 and len(brk) == 100
    assert waited < 5.0, waited
