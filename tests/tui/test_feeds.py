"""The feeds and the inbox between them and the app: coalescing and bounded hand-over,
replay order and controls, recordings of both kinds."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest

from gpujitter.daemon.analysis.records import GpuGap
from gpujitter.daemon.sinks.jsonlog import JsonLog
from gpujitter.daemon.sinks.trace import TraceHeader, TraceReader, TraceWriter
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import CpuStats, ProbeStatus, to_record
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.probes.watch import WatchSpec
from gpujitter.tui.feeds.embedded import EmbeddedFeed
from gpujitter.tui.feeds.replay import GAP_KINDS, ReplayFeed, read_recording
from gpujitter.tui.inbox import Batch, Inbox, ReplayPosition
from tests.tui import node_stream
from tests.tui.conftest import STREAM

S = 1_000_000_000


def cpu(n: int, ts: int, idle: bool = False) -> dict:
    half = {"idle_ns": [["C1", 5]]} if idle else {"hardirq_ns": 5}
    return {"type": "cpu.stats", "ts_ns": ts, "interval_ns": S, "cpu": n, **half}


def test_inbox_keeps_the_latest_state_wakes_once_and_counts_drops() -> None:
    wakes = []
    inbox = Inbox(limit=3, notify=lambda: wakes.append(1))
    inbox.records([cpu(0, 1), cpu(0, 1, idle=True), {"type": "gpu.gap", "ts_ns": 1}])
    inbox.records([cpu(0, 2), {"type": "daemon.status", "ts_ns": 2}])
    inbox.records({"type": "gpu.sample", "ts_ns": t} for t in range(5))
    assert len(wakes) == 1  # one wake-up until the app takes
    batch = inbox.take()
    assert [r["type"] for r in batch.records] == [
        "gpu.gap",
        "gpu.sample",
        "gpu.sample",
        "cpu.stats",
        "cpu.stats",
        "daemon.status",
    ]
    assert [r["ts_ns"] for r in batch.records if r["type"] == "cpu.stats"] == [2, 1]
    assert inbox.coalesced == 1 and inbox.dropped == {"gpu.sample": 3}
    assert not batch.more and not inbox.pending
    inbox.records([{"type": "gpu.gap", "ts_ns": 3}])
    assert len(wakes) == 2


def test_a_position_reported_again_unchanged_does_not_wake_the_app() -> None:
    """Regression: a paused replay reports its position every tick (50 ms); each report woke
    the app to redraw its title and status, so the app never went idle (a full screen render
    20 times a second, under the palette's dimmed background)."""
    wakes = []
    inbox = Inbox(limit=3, block=True, notify=lambda: wakes.append(1))
    paused = ReplayPosition(at_ns=5, start_ns=0, end_ns=10, playing=False, speed=1.0)
    inbox.position(paused)
    assert inbox.take().position == paused and len(wakes) == 1
    inbox.position(paused)
    assert len(wakes) == 1 and not inbox.pending
    inbox.position(paused, selected_gap="0:5")  # a jump to a gap at the same place
    assert len(wakes) == 2 and inbox.take().selected_gap == "0:5"
    inbox.position(dataclasses.replace(paused, at_ns=6))
    assert len(wakes) == 3 and inbox.take().position.at_ns == 6  # type: ignore[union-attr]


def test_a_replay_inbox_makes_the_worker_wait_instead_of_dropping() -> None:
    inbox = Inbox(limit=2, block=True)
    done = threading.Event()

    def worker() -> None:
        inbox.records({"type": "gpu.gap", "ts_ns": t} for t in range(5))
        done.set()

    threading.Thread(target=worker, daemon=True).start()
    got: list[int] = []
    deadline = time.monotonic() + 5
    while len(got) < 5:
        assert time.monotonic() < deadline, "the worker never finished"
        got += [r["ts_ns"] for r in inbox.take(limit=1).records]
        time.sleep(0.01)
    assert done.wait(5) and got == [0, 1, 2, 3, 4] and not inbox.dropped


def read(path: Path) -> tuple[list[dict], list[dict]]:
    """A recording as a replay reads it: the scene, and the rest read to its end."""
    scene, rest = read_recording(path)
    return scene, list(rest)  # type: ignore[arg-type]


def test_recordings_are_ordered_by_when_the_daemon_sends_each_record(tmp_path: Path) -> None:
    scene, records = read(STREAM)
    assert [r["type"] for r in scene] == ["hello", "snapshot"]
    assert records == node_stream.stream()[2:]  # in the order they were sent
    log = tmp_path / "attributions.jsonl"
    with JsonLog(log) as w:
        w.write(GpuGap(ts_ns=5, end_ns=9, gpu=0, sources=("util",), resolution_ns=1, confidence=1))
        w.write(GpuGap(ts_ns=7, end_ns=9, gpu=1, sources=("util",), resolution_ns=1, confidence=1))
    log.write_bytes(log.read_bytes() + b'{"type": "gpu.ga')  # a torn last line
    scene, records = read(log)
    assert scene == [] and [r["gpu"] for r in records] == [0, 1]
    assert "schema" not in records[0]
    tagged = b'{"schema": "gpujitter.attribution/1", "type": "x"}\n'
    (tmp_path / "bad.jsonl").write_bytes(tagged + b"not json\n" + tagged)
    with pytest.raises(GpujitterError, match=r"bad.jsonl:2: not a JSON line"):
        read(tmp_path / "bad.jsonl")


def test_a_log_replay_refuses_another_schema_garbage_and_ill_typed_lines(tmp_path: Path) -> None:
    log = tmp_path / "attributions.jsonl"
    with JsonLog(log) as w:
        w.write(GpuGap(ts_ns=5, end_ns=9, gpu=0, sources=("util",), resolution_ns=1, confidence=1))
    good = log.read_bytes()
    for content, message in [
        (good.replace(b"attribution/1", b"attribution/2"), ":1: record of schema gpujitter.attr"),
        (good + b"x" * (10 << 20), ":2: over 1048576 bytes without a newline"),
        (good.replace(b'"gpu":0', b'"gpu":"0"'), ":1: bad gpu.gap record: gpu: want int, got str"),
        (good.replace(b'"ts_ns":5', b'"ts_ns":5.5'), ":1: bad gpu.gap record: ts_ns: want int"),
    ]:
        log.write_bytes(content)
        with pytest.raises(GpujitterError) as err:
            read(log)
        assert message in str(err.value) and "\n" not in str(err.value)


def test_a_stream_replay_refuses_messages_whose_times_are_no_ints(tmp_path: Path) -> None:
    # The stream's own messages and kinds of later versions are not event kinds: their
    # times reached the replay's clock unchecked (a TypeError, an internal error).
    hello = b'{"type": "hello", "schema": "gpujitter.stream/1"}\n'
    stream = tmp_path / "s.ndjson"
    for line, message in [
        (
            b'{"type": "daemon.status", "ts_ns": null}',
            ":2: bad daemon.status record: ts_ns: want int",
        ),
        (b'{"type": "zz.future", "end_ns": "soon"}', ":2: bad zz.future record: end_ns: want int"),
        (b'{"type": "x", "ts_ns": 1, "interval_ns": 1.5}', ":2: bad x record: interval_ns: want"),
    ]:
        stream.write_bytes(hello + line + b"\n")
        with pytest.raises(GpujitterError) as err:
            read(stream)
        assert message in str(err.value) and "\n" not in str(err.value)


def test_a_recorded_trace_replays_with_its_header_as_the_hello(tmp_path: Path) -> None:
    topo = Topology(cpu_node={0: 0, 1: 1})
    header = TraceHeader.now(topo, ["irq", "cstate"], {})
    path = tmp_path / "node.gjtrace"
    start = header.start_ns
    with TraceWriter(path, header) as w:
        w.write(ProbeStatus(ts_ns=start, probe="irq", state="running"))
        w.write(CpuStats(ts_ns=start, interval_ns=S, cpu=1, hardirq_ns=S // 4))
    feed = ReplayFeed(path, at="end", playing=False)
    hello = feed.scene[0]
    assert hello["type"] == "hello" and hello["topology"]["cpu_node"] == {"0": 0, "1": 1}
    assert hello["clock"]["realtime_ns"] == header.clock.realtime_ns
    assert [r["type"] for r in read(path)[1]] == ["meta.probe", "cpu.stats"]
    assert feed.end_ns == start + S


def test_a_damaged_recording_replays_what_it_holds_and_says_so(tmp_path: Path) -> None:
    """A damaged trace used to stop the replay; read past its damage, it played on without
    a word of what it lacked."""
    from gpujitter.tui.model import NodeModel
    from gpujitter.tui.views.status import status_text

    topo = Topology(cpu_node={0: 0, 1: 1})
    header = TraceHeader.now(topo, ["irq"], {})
    path = tmp_path / "node.gjtrace"
    start = header.start_ns
    with TraceWriter(path, header) as w:
        for i in range(3):
            w.write(CpuStats(ts_ns=start + i * S, interval_ns=S, cpu=1, hardirq_ns=i))
    with TraceReader(path) as reader:
        second = [offset for offset, _ in reader.raw()][1]
    raw = bytearray(path.read_bytes())
    raw[second + 12 + 5] ^= 1  # inside the second record's payload (after its frame header)
    path.write_bytes(raw)
    scene, rest = read(path)
    damage = [r for r in rest if r["type"] == "replay.damage"]
    assert len(damage) == 1 and "1 damaged record(s) skipped" in damage[0]["message"]
    model = NodeModel()
    model.apply_all([*scene, *rest])
    text = status_text(model, None, None, inbox_dropped=0, paused=False).plain
    assert "damaged recording: 1 note(s), see gpujitter trace" in text


@contextlib.contextmanager
def replaying(feed: ReplayFeed) -> Iterator[Inbox]:
    """The feed played into an inbox on a thread of its own; leaving the block stops it and
    waits for its end, so that it closes its file within the test that opened it."""
    inbox = Inbox(block=True)
    stop = threading.Event()
    worker = threading.Thread(target=feed.run, args=(inbox, stop.is_set), daemon=True)
    worker.start()
    try:
        yield inbox
    finally:
        stop.set()
        inbox.close()
        worker.join()


def wait_position(
    inbox: Inbox, ok: Callable[[ReplayPosition], bool], what: str
) -> tuple[Batch, list[dict]]:
    deadline = time.monotonic() + 5
    records: list[dict] = []
    while True:
        batch = inbox.take()
        records += batch.records
        if batch.position is not None and ok(batch.position):
            return batch, records
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_replay_next_gap_brings_its_attribution_and_seeking_back_starts_over() -> None:
    feed = ReplayFeed(STREAM, at="start", playing=False)
    with replaying(feed) as inbox:
        wait_position(inbox, lambda p: p.at_ns == feed.start_ns, "the start")
        feed.next_gap()
        batch, records = wait_position(inbox, lambda p: p.at_ns > feed.start_ns, "a gap")
        first = node_stream.gaps_newest_first(node_stream.stream())[-1]
        assert batch.selected_gap == node_stream.gap_id(first)
        gaps = [r for r in records if r["type"] in ("gpu.gap", "gpu.attribution")]
        assert [(r["type"], r["ts_ns"]) for r in gaps] == [
            ("gpu.gap", first["ts_ns"]),
            ("gpu.attribution", first["ts_ns"]),
        ]
        feed.seek(feed.start_ns + S)
        batch, _ = wait_position(inbox, lambda p: p.at_ns == feed.start_ns + S, "a seek")
        assert batch.reset and [r["type"] for r in batch.records[:2]] == ["hello", "snapshot"]


def test_a_recording_that_lost_its_gaps_since_it_was_opened_plays_to_its_end(
    tmp_path: Path,
) -> None:
    """The replay reads its file again as it plays: a file rewritten in between (a rotated
    set that lost its oldest file) ends the jump to the next gap at the end, not in an
    error on the worker's thread."""
    path = tmp_path / "node.ndjson"
    path.write_bytes(STREAM.read_bytes())
    feed = ReplayFeed(path, at="start", playing=False)
    kept = [r for r in node_stream.stream() if r["type"] not in GAP_KINDS]
    path.write_bytes(node_stream.ndjson(kept[:200]))
    with replaying(feed) as inbox:
        wait_position(inbox, lambda p: p.at_ns == feed.start_ns, "the start")
        feed.next_gap()
        wait_position(inbox, lambda p: p.done and p.at_ns == feed.end_ns, "the end")


def test_the_committed_stream_fixture_is_what_its_generator_writes() -> None:
    assert STREAM.read_bytes() == node_stream.ndjson(node_stream.stream())


def test_an_events_file_replays_through_the_pipeline_as_a_trace_does(tmp_path: Path) -> None:
    """`gaps --save-events` output plays in `top --replay` with the gaps and attributions a
    trace of the same events gives (it used to show none, without a word)."""
    example = Path(__file__).parents[2] / "examples" / "h200-training.gjtrace"
    with TraceReader(example) as reader:
        lines = [to_record(reader.header.clock), *(to_record(e) for e in reader)]
    events = tmp_path / "events.ndjson"
    events.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in lines))
    _, from_trace = read(example)
    scene, from_events = read(events)
    assert [r["type"] for r in scene] == ["hello", "snapshot"]
    assert scene[0]["clock"]["realtime_ns"] == lines[0]["realtime_ns"]

    def gaps(records: list) -> list[tuple[str, int, int]]:
        return [(r["type"], r["ts_ns"], r["end_ns"]) for r in records if r["type"] in GAP_KINDS]

    assert gaps(from_events) == gaps(from_trace) and len(gaps(from_trace)) > 30


def test_embedded_without_probes_runs_on_the_kernel_counters(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No bcc (or no root): every probe is said to be unavailable with the reason, and the
    runtime keeps going on the kernel's counters, with its own status each tick, until the
    app stops it."""

    class NoBcc:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def __enter__(self) -> None:
            raise ModuleNotFoundError("No module named 'bcc'")

    monkeypatch.setattr("gpujitter.probes.live.LiveProbes", NoBcc)
    topo = load_topology()
    feed = EmbeddedFeed(["sched", "irq"], topology=topo, watch=WatchSpec(all=True),
                            tick_s=0.05)  # fmt: skip
    got: list[dict] = []
    said: list[tuple[str, str]] = []

    class App:
        def records(self, records: object) -> None:
            got.extend(records)  # type: ignore[call-overload]

        def connection(self, state: str, detail: str = "") -> None:
            said.append((state, detail))

    def statuses() -> list[dict]:
        return [r for r in got if r["type"] == "daemon.status"]

    feed.run(App(), lambda: len(statuses()) >= 3)  # type: ignore[arg-type]
    assert [r["type"] for r in got[:2]] == ["hello", "snapshot"]
    refused = {r["probe"]: r for r in got if r["type"] == "meta.probe"}
    assert set(refused) == {"sched", "irq"}
    assert all(r["state"] == "unavailable" and "bcc" in r["reason"] for r in refused.values())
    assert {r["cpu"] for r in got if r["type"] == "cpu.stats"} == set(topo.cpus)
    assert statuses()[-1]["clients"] == 1
    assert "kernel counters only" in said[-2][1] and said[-1] == ("stopped", "")
