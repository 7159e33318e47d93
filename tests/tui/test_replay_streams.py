"""`top --replay` streams its recording: playing reads the file as it goes, so what a replay
holds does not grow with the recording's length (a trace of hours never has to fit in
memory, docs/trace-format.md)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from gpujitter.daemon.sinks.trace import TraceHeader, TraceWriter
from gpujitter.probes.events import CpuStats, GpuSample
from gpujitter.probes.topology import Topology
from gpujitter.tui.feeds.replay import ReplayFeed
from gpujitter.tui.inbox import ReplayPosition

S = 1_000_000_000
MS = 1_000_000


def write_trace(path: Path, seconds: int) -> Path:
    """A node's per-CPU figures and a GPU's samples, `seconds` long: records the stream
    carries, each of which a replay hands to the app."""
    header = TraceHeader.now(Topology(cpu_node={c: 0 for c in range(8)}), ["irq"], {})
    t0 = header.start_ns
    with TraceWriter(path, header) as w:
        for s in range(seconds):
            at = t0 + s * S
            for cpu in range(8):
                w.write(CpuStats(ts_ns=at, interval_ns=S, cpu=cpu, hardirq_ns=cpu * MS))
            for k in range(10):
                w.write(GpuSample(at + k * 100 * MS, 0, "power", 300.0 + k, 100 * MS))
    return path


class Discard:
    """An app that takes each record and keeps none (a Receiver)."""

    def __init__(self) -> None:
        self.records_seen = 0
        self.done = False

    def records(self, records: object) -> None:
        self.records_seen += sum(1 for _ in records)  # type: ignore[attr-defined]

    def reset(self) -> None:
        pass

    def connection(self, state: str, detail: str = "") -> None:
        pass

    def position(self, pos: ReplayPosition, selected_gap: str | None = None) -> None:
        self.done = pos.done


def played_to_the_end(path: Path) -> tuple[int, int]:
    """(records the app was handed, the replay's peak memory in bytes) for opening the
    recording and playing it to its end."""
    app = Discard()
    tracemalloc.start()
    try:
        feed = ReplayFeed(path, at="end", playing=False)
        feed.run(app, lambda: app.done)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return app.records_seen, peak


def test_a_replay_holds_no_more_for_a_longer_trace(tmp_path: Path) -> None:
    short_records, short_peak = played_to_the_end(write_trace(tmp_path / "short.gjtrace", 300))
    long_records, long_peak = played_to_the_end(write_trace(tmp_path / "long.gjtrace", 1200))
    assert long_records - 2 == 4 * (short_records - 2) == 21_600  # all, after hello+snapshot
    # Holding the long replay's records would take ~6 MiB more than the short one's.
    assert long_peak - short_peak < 1 << 20, (short_peak, long_peak)


def test_a_recording_with_no_timed_record_plays_as_an_empty_one(tmp_path: Path) -> None:
    # A daemon stopped before its first event leaves a header-only trace; a stream captured
    # as it connected holds only the hello. `top --replay` ended in an internal error on
    # both (the empty rest had no close()).
    header_only = tmp_path / "a.gjtrace"
    with TraceWriter(header_only, TraceHeader.now(Topology(cpu_node={0: 0}), ["irq"], {})):
        pass
    hello_only = tmp_path / "b.ndjson"
    hello_only.write_text('{"type": "hello", "schema": "gpujitter.stream/1"}\n')
    for path in (header_only, hello_only):
        app = Discard()
        feed = ReplayFeed(path, at="end", playing=False)
        feed.run(app, lambda app=app: app.done)
        assert (feed.start_ns, feed.end_ns, feed.gaps) == (0, 0, 0)
        assert app.done
