"""The feeds and the inbox between them and the app: coalescing and bounded hand-over,
replay order and controls, recordings of both kinds."""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import orjson
import pytest

from gpujitter.daemon.analysis.records import GpuGap
from gpujitter.daemon.sinks.jsonlog import JsonLog
from gpujitter.daemon.sinks.stream import StreamServer
from gpujitter.daemon.sinks.trace import TraceHeader, TraceReader, TraceWriter
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import ClockRef, CpuStats, ProbeStatus, to_record
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.probes.watch import WatchSpec
from gpujitter.tui.feeds import Feed, Receiver
from gpujitter.tui.feeds import socket as socket_feed
from gpujitter.tui.feeds.embedded import EmbeddedFeed
from gpujitter.tui.feeds.replay import GAP_KINDS, ReplayFeed, read_recording
from gpujitter.tui.feeds.socket import SocketFeed
from gpujitter.tui.inbox import Batch, Inbox, ReplayPosition
from tests.tui import node_stream
from tests.tui.conftest import STREAM, Daemon, python_as_nobody

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
    assert scene == [] and [r.get("gpu") for r in records] == [0, 1, None]
    assert "schema" not in records[0]
    assert records[2] == {"type": "replay.damage", "message": f"{log}: torn last line (16 bytes)"}


def test_a_log_replay_takes_its_wall_clock_from_the_lines_time(tmp_path: Path) -> None:
    """`report` read a log's times by its lines' `time`; `top --replay` of the same log had
    no clock at all (a log has no hello) and showed no wall time. The clock comes before
    the first line that has a time, and again where a line's says it was set."""
    log = tmp_path / "attributions.jsonl"
    s = 1_000_000_000
    gap = GpuGap(ts_ns=5 * s, end_ns=6 * s, gpu=0, sources=("util",), resolution_ns=1,
                 confidence=1)  # fmt: skip
    with JsonLog(log) as w:
        w.write(gap)  # no clock: a line of before lines had a time
        w.clock = ClockRef(ts_ns=0, realtime_ns=1_767_268_800 * s)
        w.write(dataclasses.replace(gap, ts_ns=7 * s, end_ns=8 * s))
        w.write(dataclasses.replace(gap, ts_ns=9 * s, end_ns=10 * s))
        w.clock = ClockRef(ts_ns=10 * s, realtime_ns=(1_767_268_800 + 15) * s)  # set +5 s
        w.write(dataclasses.replace(gap, ts_ns=11 * s, end_ns=12 * s))
    _, records = read(log)
    assert [(r["type"], r.get("realtime_ns")) for r in records] == [
        ("gpu.gap", None),
        ("meta.clock", (1_767_268_800 + 7) * s),
        ("gpu.gap", None),
        ("gpu.gap", None),
        ("meta.clock", (1_767_268_800 + 16) * s),
        ("gpu.gap", None),
    ]
    assert records[1]["ts_ns"] == 7 * s


def test_a_log_replay_skips_damaged_lines_and_refuses_another_schema(tmp_path: Path) -> None:
    log = tmp_path / "attributions.jsonl"
    with JsonLog(log) as w:
        w.write(GpuGap(ts_ns=5, end_ns=9, gpu=0, sources=("util",), resolution_ns=1, confidence=1))
    good = log.read_bytes()
    log.write_bytes(good.replace(b"attribution/1", b"attribution/2"))
    with pytest.raises(GpujitterError) as err:
        read(log)
    assert ":1: record of schema gpujitter.attr" in str(err.value)
    assert "\n" not in str(err.value)
    for damaged, why in [
        (b"not json\n", "line 2, not a JSON line"),
        (b"x" * (10 << 20), "line 2, over 1048576 bytes without a newline"),
        (good.replace(b'"gpu":0', b'"gpu":"0"'), "line 2, bad gpu.gap record: gpu: want int"),
        (good.replace(b'"ts_ns":5', b'"ts_ns":5.5'), "line 2, bad gpu.gap record: ts_ns: want"),
    ]:  # fmt: skip
        log.write_bytes(good + damaged + (good if damaged.endswith(b"\n") else b""))
        _, records = read(log)
        gaps = [r for r in records if r["type"] == "gpu.gap"]
        assert len(gaps) == (2 if damaged.endswith(b"\n") else 1)
        assert records[-1]["type"] == "replay.damage" and why in records[-1]["message"]


def test_a_stream_replay_skips_messages_whose_times_are_no_ints(tmp_path: Path) -> None:
    # The stream's own messages and kinds of later versions are not event kinds: their
    # times reached the replay's clock unchecked (a TypeError, an internal error).
    hello = b'{"type": "hello", "schema": "gpujitter.stream/1"}\n'
    after = b'{"type": "daemon.status", "ts_ns": 7}\n'
    stream = tmp_path / "s.ndjson"
    for line, why in [
        (b'{"type": "daemon.status", "ts_ns": null}', "bad daemon.status record: ts_ns: want int"),
        (b'{"type": "zz.future", "end_ns": "soon"}', "bad zz.future record: end_ns: want int"),
        (b'{"type": "x", "ts_ns": 1, "interval_ns": 1.5}', "bad x record: interval_ns: want"),
        (b'{"ts_ns": 1}', "record type is not a string"),
    ]:
        stream.write_bytes(hello + line + b"\n" + after)
        _, records = read(stream)
        assert records[0] == {"type": "daemon.status", "ts_ns": 7}
        assert f"the first: line 2, {why}" in records[1]["message"]


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


def test_a_clock_set_during_a_replayed_recording_is_said_in_the_status_line(
    tmp_path: Path,
) -> None:
    """top --replay followed a meta.clock (and a rotated file's header that found the clock
    set) and moved every time it showed without a word; the status line says it."""
    from datetime import UTC

    from gpujitter.tui.model import NodeModel
    from gpujitter.tui.text import WallClock
    from gpujitter.tui.views.status import status_text

    header = dataclasses.replace(
        TraceHeader.now(Topology(cpu_node={0: 0, 1: 1}), ["irq"], {}),
        clock=ClockRef(ts_ns=0, realtime_ns=1_767_268_800 * S),  # 2026-01-01 12:00:00 UTC
        start_ns=S,
    )
    set_on = ClockRef(ts_ns=3 * S, realtime_ns=(1_767_268_803 + 3600) * S)  # an hour on
    second = dataclasses.replace(header, segment=1, start_ns=3 * S, clock=set_on)
    rotated = tmp_path / "rotated"
    rotated.mkdir()
    for name, hdr, at in (("a", header, (1, 2)), ("b", second, (3, 4))):
        with TraceWriter(rotated / f"{name}.gjtrace", hdr) as w:
            for t in at:
                w.write(CpuStats(ts_ns=t * S, interval_ns=S, cpu=1, hardirq_ns=t))
    scene, rest = read(rotated)
    model = NodeModel(WallClock(tz=UTC))
    model.apply_all([*scene, *rest])
    text = status_text(model, None, None, inbox_dropped=0, paused=False).plain
    assert "clock set +3600.000 s at 13:00:03" in text
    # a reference that sets nothing (an events file repeats its first) is said by none
    model = NodeModel(WallClock(tz=UTC))
    model.apply_all([*scene, *(r for r in rest if r["type"] != "meta.clock"), {
        "type": "meta.clock", "ts_ns": 4 * S, "realtime_ns": (1_767_268_804 * S)}])  # fmt: skip
    assert "clock set" not in status_text(model, None, None, inbox_dropped=0, paused=False).plain


R = TypeVar("R", bound=Receiver)


@contextlib.contextmanager
def running(feed: Feed, receiver: R, on_stop: Callable[[], object] = lambda: None) -> Iterator[R]:
    """The feed run into `receiver` on a thread of its own; leaving the block stops it and
    waits for its end, so that it closes what it opened within the test that started it."""
    stop = threading.Event()
    worker = threading.Thread(target=feed.run, args=(receiver, stop.is_set), daemon=True)
    worker.start()
    try:
        yield receiver
    finally:
        stop.set()
        on_stop()
        worker.join()


def replaying(feed: ReplayFeed) -> contextlib.AbstractContextManager[Inbox]:
    inbox = Inbox(block=True)
    return running(feed, inbox, inbox.close)


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


def test_a_stream_whose_first_timed_record_comes_late_replays_from_that_record(
    tmp_path: Path,
) -> None:
    """A captured stream may hold an untimed message before its first timed record (the
    daemon's `dropped` notice): the replay starts at the first time there is, not at
    monotonic 0 (a seek bar over the node's uptime, minutes of nothing at 1x)."""
    records = node_stream.stream()
    plain = ReplayFeed(STREAM)
    path = tmp_path / "dropped-first.ndjson"
    path.write_bytes(node_stream.ndjson([*records[:2], {"type": "dropped", "count": 3,
                                         "total": 3}, *records[2:]]))  # fmt: skip
    feed = ReplayFeed(path)
    assert (feed.start_ns, feed.end_ns) == (plain.start_ns, plain.end_ns)


class Heard:
    """A Receiver that keeps what a feed told it."""

    def __init__(self) -> None:
        self.got: list[dict] = []
        self.states: list[tuple[str, str]] = []

    def records(self, records: Iterable[dict]) -> None:
        self.got += records

    def reset(self) -> None:
        pass

    def connection(self, state: str, detail: str = "") -> None:
        self.states.append((state, detail))

    def position(self, pos: ReplayPosition, selected_gap: str | None = None) -> None:
        pass


def feeding(feed: SocketFeed) -> contextlib.AbstractContextManager[Heard]:
    return running(feed, Heard())


@contextlib.contextmanager
def listening(path: Path, serve: Callable[[socket.socket], None]) -> Iterator[list[int]]:
    """A unix socket at `path` that hands each connection to `serve`; yields the count of
    connections taken."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)
    taken = [0]

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            taken[0] += 1
            with conn:
                serve(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield taken
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join()


def wait_for(ok: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 5
    while not ok():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_daemon_that_hangs_up_at_once_is_asked_again_backing_off(tmp_path: Path) -> None:
    """A peer that accepts and closes (a wedged daemon, something else on the path) was
    asked again at once, ~1,250 times a second: a try without a hello and snapshot backs
    off as a refused connect does."""
    feed = SocketFeed(tmp_path / "s.sock", retry_s=0.05, retry_max_s=0.4)
    with listening(feed.path, lambda conn: None) as taken, feeding(feed) as heard:
        time.sleep(1.5)  # 0.05 + 0.1 + 0.2 + 0.4 + 0.4 + 0.4: seven tries at most
    assert 3 <= taken[0] <= 8
    assert ("waiting", "daemon closed before its snapshot, retrying") in heard.states


def test_a_daemon_refusing_this_client_is_said_and_backed_off_from(tmp_path: Path) -> None:
    """The daemon's refusal (an error line, then the close) is what the status line shows,
    and counts as a failed try: it used to reset the back-off, as any record did."""
    daemon = Daemon(tmp_path / "s.sock", node_stream.stream())  # its hello and snapshot
    server = StreamServer(daemon.path, hello=lambda: dict(daemon.hello),
                          snapshot=lambda: [daemon.snapshot], max_clients=0).start()  # fmt: skip
    try:
        feed = SocketFeed(daemon.path, retry_s=0.05, retry_max_s=0.4)
        with feeding(feed) as heard:
            time.sleep(1.5)
        assert 3 <= server.refused <= 8
        assert ("waiting", "daemon refused: too many clients, retrying") in heard.states
        assert "connected" not in {state for state, _ in heard.states}
    finally:
        server.close()


def test_a_line_longer_than_any_the_daemon_sends_is_skipped_to_its_newline(
    tmp_path: Path,
) -> None:
    """The reader holds at most its line_bytes of a line: past that the line is one bad line
    (counted at once) and what follows its newline is read as ever."""
    hello = orjson.dumps({"type": "hello", "pid": 7}) + b"\n"
    sent, go_on, checked = threading.Event(), threading.Event(), threading.Event()
    limit = 1 << 20  # the rule, not LINE_BYTES's 64 MiB, is under test

    def serve(conn: socket.socket) -> None:
        if sent.is_set():
            return  # a reconnection (the feed backs off and comes again): nothing for it
        conn.sendall(b"x" * (limit + (1 << 16)))
        sent.set()
        go_on.wait(5)
        conn.sendall(b"more of it\n" + hello)
        checked.wait(5)  # held open until the counts are read: no reconnection meanwhile

    feed = SocketFeed(tmp_path / "s.sock", line_bytes=limit)
    with listening(feed.path, serve), feeding(feed) as heard:
        sent.wait(5)
        wait_for(lambda: feed.bad_lines == 1, "the over-long line counted")
        go_on.set()
        wait_for(lambda: heard.got == [{"type": "hello", "pid": 7}], "the next line")
        assert feed.bad_lines == 1
        checked.set()


def test_json_lines_that_are_no_object_are_counted_as_bad_lines(tmp_path: Path) -> None:
    """`[1,2]`, `5`, `"x"`, `null`: JSON, but no record: counted with the lines that are not
    JSON (they used to vanish without a count), and the records around them still arrive."""
    hello = orjson.dumps({"type": "hello", "pid": 7}) + b"\n"
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        if done.is_set():
            return
        conn.sendall(b'[1,2]\n5\n"x"\nnull\n{not json\n' + hello)
        done.wait(5)

    feed = SocketFeed(tmp_path / "s.sock")
    with listening(feed.path, serve), feeding(feed) as heard:
        wait_for(lambda: heard.got == [{"type": "hello", "pid": 7}], "the hello")
        assert feed.bad_lines == 5
        done.set()


def test_a_socket_that_refuses_this_user_is_not_taken_for_no_daemon(
    closed_to_others: Path,
) -> None:
    """EACCES on connect means a daemon is there and its socket's mode shuts this user out:
    `top` says so (and runs no probes in its place); --daemon's status line says so."""
    child = """if True:
        import sys
        from pathlib import Path
        from gpujitter.errors import GpujitterError
        from gpujitter.tui.feeds.socket import SocketFeed, daemon_listening
        from tests.tui.test_feeds import Heard
        path = Path(sys.argv[1])
        try:
            print("listening", daemon_listening(path))
        except GpujitterError as err:
            print(err)
        heard = Heard()
        SocketFeed(path).run(heard, lambda: bool(heard.states))
        print(heard.states[0])
    """
    done = python_as_nobody("-c", child, str(closed_to_others))
    why = (f"daemon at {closed_to_others} refuses this user (Permission denied): ask for the "
           "socket's group (socket.group) or run as root")  # fmt: skip
    assert done.stdout.splitlines() == [why, repr(("waiting", why))], done.stderr


def test_a_daemon_that_takes_the_connection_and_says_nothing_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wedged (its stream thread stopped, its backlog still accepting): "starting" for ever.
    monkeypatch.setattr(socket_feed, "HELLO_S", 0.3)
    release = threading.Event()
    feed = SocketFeed(tmp_path / "s.sock")
    with listening(feed.path, lambda conn: release.wait(5)), feeding(feed) as heard:
        wait_for(lambda: bool(heard.states), "the first try")
        wait_for(
            lambda: any("sent no hello in 0.3 s" in detail for _, detail in heard.states),
            "the silence said",
        )
        release.set()


def test_a_captured_stream_after_blank_lines_replays_as_it_was_sent(tmp_path: Path) -> None:
    padded = tmp_path / "node.ndjson"
    padded.write_bytes(b"\n\n" + STREAM.read_bytes())
    assert read(padded) == read(STREAM)
