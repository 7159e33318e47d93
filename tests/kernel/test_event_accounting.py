"""Every streamed record is accounted for: a generator's system calls, each one a malloc
record (threshold 0), come out as received, lost in the kernel or dropped in Python, with
nothing missing. CI-sized (20k records); the 100k/s figure is bench/event_rate.py's."""

from __future__ import annotations

import time
from pathlib import Path

from bench.event_rate import account, build_generator, run_generator, start_generator
from gpujitter.daemon.service.runtime import EventQueue
from gpujitter.probes.events import Event, ProbeStatus
from gpujitter.probes.runner import ProbeThread
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec

CALLS = 20_000
QUEUED = 5_000  # the event queue's bound: nothing drains it, so the rest is dropped


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
        with ProbeThread(
            ["malloc"],
            topology=load_topology(nvml=False),
            watch=WatchSpec(pids={gen.pid}),
            emit=emit,
            thresholds={"malloc": {"syscall": 0}},
            tick_ms=100,
        ):
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
