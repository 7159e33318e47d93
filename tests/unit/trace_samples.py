"""Test data for the storage tests: one event of every registered kind (built from the
dataclass annotations, so a kind added later is covered without touching the tests) and a
fixed trace header."""

from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from gpujitter.daemon.sinks.trace import TraceHeader
from gpujitter.probes.events import ClockRef, Event, event_kinds
from gpujitter.probes.topology import Topology


def _value(hint: Any, name: str, counter: Iterator[int]) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return args[-1]
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return (_value(args[0], name, counter), _value(args[0], name, counter))
        return tuple(_value(a, name, counter) for a in args)
    if origin is types.UnionType:  # a tagged union of nested records: its first member
        return _value(args[0], name, counter)
    if dataclasses.is_dataclass(hint):
        return _nested(hint, counter)
    if hint is bool:
        return True
    if hint is int:
        # Past 2**32 (and for addresses past 2**63) so that no narrowing goes unnoticed.
        if name == "address":
            return (1 << 63) + next(counter)
        if name == "gpu":  # an index a node has
            return next(counter) % 8
        # a span's end far enough on for the totals counted within it (irq.stolen, fault.minor)
        return (1 << 35 if name == "end_ns" else 1 << 33) + next(counter)
    if hint is float:  # a confidence is a fraction: from_record refuses one outside 0..1
        return 1 / (2 + next(counter)) if name == "confidence" else 0.25 + next(counter)
    if hint is str:
        return f"{name}-é{next(counter)}"
    raise TypeError(f"no sample value for {name}: {hint!r}")


def _nested(cls: Any, counter: Iterator[int]) -> Any:
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name != "what"]  # evidence tags stay
    return cls(**{f.name: _value(hints[f.name], f.name, counter) for f in fields})


def sample_event(cls: type[Event], counter: Iterator[int]) -> Event:
    ev = _nested(cls, counter)
    parts = getattr(ev, "parts", None)
    if parts is not None:  # an attribution's parts add up to its gap (from_record checks)
        ev = dataclasses.replace(ev, end_ns=ev.ts_ns + sum(p.ns for p in parts))
    return ev


def every_kind() -> list[Event]:
    """The same events on every call: distinct values in every field."""
    counter = itertools.count(1)
    return [sample_event(cls, counter) for _, cls in sorted(event_kinds().items())]


def header(**changes: Any) -> TraceHeader:
    base = TraceHeader(
        host="node-7",
        kernel="6.18.0-test",
        topology=Topology(
            cpu_node={0: 0, 1: 1}, irq_node={36: 1}, gpu_node={"0000:00:06.0": 0}, override="t"
        ),
        clock=ClockRef(ts_ns=5_000_000_000, realtime_ns=1_700_000_000_000_000_000),
        start_ns=5_000_100_000,
        probes=("malloc", "sched"),
        thresholds={"malloc": {"syscall": 100_000}, "sched": {"offcpu": 1_000_000}},
        watch="comm python*",
        session="0123456789ab",
    )
    return dataclasses.replace(base, **changes)


def one_gap_trace(path: Path) -> Path:
    """A recording with one gap at 100-140 ms of the synthetic stream's clock on GPU 0: 25 ms
    run-queue wait behind `stress` (tid 555, which held the CPU for 24 ms of it), the rest
    host work."""
    from gpujitter.daemon.sinks.trace import TraceWriter
    from tests.fixtures.streams.synthetic import TWO_NODES, Stream

    s = Stream().offcpu(
        100, 125, runnable=100, state="preempted", other=555, other_comm="stress", other_held=24
    )
    writer = TraceWriter(path, header(topology=TWO_NODES))
    for ev in s.ran(0, 1000).gap(100, 140).in_emission_order():
        writer.write(ev)
    writer.close()
    return path
