"""The core's exits as the probes read them (probes/watch.py ExitLog, ExitReader): each
reader gets the exits since its last read, oldest first, and is told to walk its maps where
the log cannot say (every process watched, more exits than it keeps) and every 10 s."""

from __future__ import annotations

from types import SimpleNamespace

from gpujitter.probes.host import HostPaths
from gpujitter.probes.topology import Topology
from gpujitter.probes.watch import (
    EXIT_PROCESS,
    EXIT_THREAD,
    EXITS_KEPT,
    CoreBpf,
    ExitReader,
    WatchSpec,
)

S = 1_000_000_000


def core(spec: WatchSpec) -> CoreBpf:
    made = CoreBpf(spec, Topology(cpu_node={0: 0}), HostPaths())
    made._emit = lambda ev: None
    return made


def exit_record(tgid: int, tid: int) -> SimpleNamespace:
    """A proc_event as the core's ring hands it over (watch.bpf.c)."""
    kind = EXIT_PROCESS if tid == tgid else EXIT_THREAD
    return SimpleNamespace(ts_ns=1, tgid=tgid, tid=tid, exited=kind, comm=b"job", filename=b"")


def test_each_reader_gets_the_exits_since_its_last_read_after_a_first_walk() -> None:
    c = core(WatchSpec(pids={10}))
    c.on_proc(exit_record(10, 11))  # before the readers: not theirs
    first, second = ExitReader(c), ExitReader(c)
    assert first.take(0) is None  # the first take walks
    c.on_proc(exit_record(10, 12))
    assert first.take(1 * S) == [(10, 12)]
    assert second.take(1 * S) is None  # its first take
    c.on_proc(exit_record(10, 13))
    c.on_proc(exit_record(10, 10))
    assert first.take(2 * S) == [(10, 13), (10, 10)]
    assert second.take(2 * S) == [(10, 13), (10, 10)]
    assert first.take(3 * S) == []


def test_a_reader_walks_every_10_s_and_when_more_exits_came_than_are_kept() -> None:
    c = core(WatchSpec(pids={10}))
    reader = ExitReader(c)
    assert reader.take(0) is None
    assert reader.take(9 * S) == []
    assert reader.take(10 * S) is None  # exits no record told of: a record lost, say
    for tid in range(11, 12 + EXITS_KEPT):  # one more than are kept
        c.on_proc(exit_record(10, tid))
    assert reader.take(11 * S) is None
    c.on_proc(exit_record(10, 400))
    assert reader.take(12 * S) == [(10, 400)]  # caught up: read from the log again


def test_with_every_process_watched_a_reader_walks_at_every_tick() -> None:
    # The kernel streams the exits of processes in the watched map only, and with every
    # process watched that map does not hold them all.
    c = core(WatchSpec(all=True))
    reader = ExitReader(c)
    c.on_proc(exit_record(10, 11))
    assert [reader.take(t * S) for t in range(3)] == [None, None, None]
