"""The trace format: round trips, and what a reader does with every kind of damage (a
damaged preamble or header one GpujitterError line; past them every intact record is read
and what could not be is reported; never wrong data)."""

from __future__ import annotations

import dataclasses
import os
import struct
import subprocess
import time
import tracemalloc
import zlib
from pathlib import Path

import orjson
import pytest

from gpujitter.daemon.sinks.jsonlog import ZEROS_LOST
from gpujitter.daemon.sinks.trace import (
    FORMAT_MAJOR,
    FORMAT_MINOR,
    FRAME_HEADER_SIZE,
    PREAMBLE_SIZE,
    TraceHeader,
    TraceReader,
    TraceSet,
    TraceWriter,
    encode,
    frame,
    preamble,
)
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import AllocSyscall, Event, OffCpu, from_record, to_json, to_record
from gpujitter.probes.host import HostPaths
from tests.unit.sink_child import kill_when_ready, sink_writer
from tests.unit.trace_samples import every_kind, header


def write_trace(path: Path, events: list[Event], hdr: TraceHeader | None = None) -> bytes:
    with TraceWriter(path, hdr or header()) as w:
        for ev in events:
            w.write(ev)
    return path.read_bytes()


def read(path: Path) -> tuple[list[Event], TraceReader]:
    with TraceReader(path) as reader:
        return list(reader), reader


def one_line_error(path: Path) -> str:
    with pytest.raises(GpujitterError) as err:
        read(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message
    return message


def alloc(i: int) -> AllocSyscall:
    return AllocSyscall(
        ts_ns=1_000_000 * i, dur_ns=i, tid=7, tgid=7, cpu=i % 2, syscall="mmap", length=4096, ret=i
    )


def data_start(raw: bytes) -> int:
    """Offset of the first event frame (after the preamble and the header frame)."""
    length = int.from_bytes(raw[PREAMBLE_SIZE : PREAMBLE_SIZE + 4], "little")
    return PREAMBLE_SIZE + FRAME_HEADER_SIZE + length


def frame_starts(raw: bytes) -> list[int]:
    """Offsets of every event frame, and the end of the file last."""
    starts, off = [], data_start(raw)
    while off < len(raw):
        starts.append(off)
        off += FRAME_HEADER_SIZE + int.from_bytes(raw[off : off + 4], "little")
    return [*starts, off]


def test_every_kind_round_trips_with_the_header(tmp_path: Path) -> None:
    events = every_kind()
    path = tmp_path / "t.gjtrace"
    write_trace(path, events)
    got, reader = read(path)
    assert got == events
    assert reader.header == header()
    assert reader.format_version == (1, 1)
    assert (reader.records, reader.torn_tail_bytes, reader.skipped) == (len(events), 0, {})
    assert reader.damage_notes() == []


def test_truncation_at_every_offset_keeps_every_whole_record_or_fails_in_one_line(
    tmp_path: Path,
) -> None:
    events = [alloc(i) for i in range(4)]
    raw = write_trace(tmp_path / "full.gjtrace", events)
    starts = frame_starts(raw)
    path = tmp_path / "cut.gjtrace"
    for cut in range(len(raw)):
        path.write_bytes(raw[:cut])
        if cut < starts[0]:
            message = one_line_error(path)
            assert ("truncated" in message) or ("empty" in message and cut == 0)
            continue
        whole = sum(1 for end in starts[1:] if end <= cut)
        got, reader = read(path)
        assert got == events[:whole], cut
        torn = cut - starts[whole]
        assert reader.torn_tail_bytes == torn
        assert bool(reader.damage_notes()) == (torn > 0)


def test_every_bit_flip_is_an_error_or_reported_and_no_record_is_wrong(tmp_path: Path) -> None:
    """A flip in the preamble or the header is one line (nothing can be read without them);
    past them the reader goes on where the framing allows, and every flip is reported: the
    records delivered are the written ones, in order, each one whole."""
    events = [alloc(1), every_kind()[-1], alloc(2)]
    raw = write_trace(tmp_path / "full.gjtrace", events)
    starts = frame_starts(raw)
    last = starts[-2]
    path = tmp_path / "flipped.gjtrace"
    errors = 0
    for bit in range(len(raw) * 8):
        byte = bit // 8
        flipped = bytearray(raw)
        flipped[byte] ^= 1 << (bit % 8)
        path.write_bytes(flipped)
        try:
            got, reader = read(path)
        except GpujitterError as err:
            assert "\n" not in str(err)
            assert byte < starts[0], bit
            errors += 1
            continue
        assert byte >= starts[0] and reader.damage_notes(), bit
        hit = max(i for i, start in enumerate(starts[:-1]) if start <= byte)
        in_head = byte < starts[hit] + FRAME_HEADER_SIZE
        if hit == len(events) - 1 and not in_head:  # the last payload: a torn tail
            assert got == events[:-1] and reader.torn_tail_bytes == len(raw) - last
        elif in_head:  # its frame header fails its checksum: read on from the next frame
            assert got == events[:hit] + events[hit + 1 :], bit
            assert reader.unread_bytes == starts[hit + 1] - starts[hit], bit
        else:  # its payload: that record alone is skipped
            assert got == events[:hit] + events[hit + 1 :], bit
            assert reader.damaged
    # The preamble and the header's frame (its header, its payload) refuse the file.
    assert errors == starts[0] * 8


def test_zero_filled_tail_is_a_torn_tail(tmp_path: Path) -> None:
    # A crash after the file grew but before its data reached the disk leaves zeros.
    events = [alloc(i) for i in range(3)]
    path = tmp_path / "t.gjtrace"
    path.write_bytes(write_trace(path, events) + bytes(5000))
    got, reader = read(path)
    assert got == events
    assert reader.torn_tail_bytes == 5000
    # said as the zeros they are, in the JSON-lines readers' words, not as a writer stopped
    (note,) = reader.damage_notes()
    assert note.endswith(
        f"torn last record dropped (5000 bytes, 5000 of them zeros ({ZEROS_LOST}))"
    )
    # A size set with no data written (sparse): its holes are skipped, not read (4 GiB of
    # them took half a minute), and data after a hole is still looked at.
    with open(path, "r+b") as f:
        f.truncate(len(path.read_bytes()) + (4 << 30))
    got, reader = read(path)
    assert got == events and reader.torn_tail_bytes == 5000 + (4 << 30)
    with open(path, "ab") as f:
        f.write(b"\x01")
    got, reader = read(path)
    assert got == events and reader.unread_bytes == 5000 + (4 << 30) + 1
    assert "corrupt record header (checksum mismatch)" in reader.damage_notes()[0]
    # a frame cut short, no zeros in its payload (its length's are no crash's): as before
    path.unlink()
    path.write_bytes(write_trace(path, events)[:-3])
    (note,) = read(path)[1].damage_notes()
    assert note.endswith("bytes; the writer stopped mid-write)")


@pytest.mark.parametrize("bit", [0, 20, 31, 40, 64])  # the length's, its checksum's
def test_a_damaged_frame_header_costs_its_record_not_the_records_after_it(
    tmp_path: Path, bit: int
) -> None:
    """One flipped bit of a frame's length lost every record after it (the last 1.9 MB of a
    real trace: 849 of its 9,551 events read): where the next frame began was not known.
    The next intact frame is found (its payload's kind, both checksums) and read on."""
    events = [alloc(i) for i in range(1, 400)]
    path = tmp_path / "t.gjtrace"
    raw = bytearray(write_trace(path, events))
    at = data_start(bytes(raw))
    for _ in range(200):  # to the 201st record's frame
        at += FRAME_HEADER_SIZE + int.from_bytes(raw[at : at + 4], "little")
    length = int.from_bytes(raw[at : at + 4], "little")
    raw[at + bit // 8] ^= 1 << bit % 8
    path.write_bytes(raw)
    got, reader = read(path)
    assert got == events[:200] + events[201:]
    (note,) = reader.damage_notes()
    assert note.endswith(
        f"corrupt record header (checksum mismatch) at byte {at}; "
        f"{FRAME_HEADER_SIZE + length} bytes could not be read (the trace is damaged)"
    )


def test_garbage_after_the_last_record_is_damage_and_the_records_are_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.gjtrace"
    path.write_bytes(write_trace(path, [alloc(1)]) + b"\x01" * 40)
    got, reader = read(path)
    assert got == [alloc(1)] and reader.damaged
    (note,) = reader.damage_notes()
    assert "corrupt record header (checksum mismatch) at byte" in note
    assert "the last 40 bytes could not be read" in note


def test_unknown_major_version_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "t.gjtrace"
    raw = write_trace(path, [alloc(1)])
    path.write_bytes(preamble(2, 0) + raw[PREAMBLE_SIZE:])
    assert "trace format 2.0 is not readable" in one_line_error(path)


def test_unknown_event_schema_major_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "t.gjtrace"
    write_trace(path, [alloc(1)], header(schema=(2, 0)))
    assert "events of schema 2.0 are not readable" in one_line_error(path)


def test_newer_minor_is_read_and_its_unknown_kinds_skipped_and_counted(tmp_path: Path) -> None:
    hdr = header().to_record() | {"schema": [1, 9], "added_in_1_9": {"x": 1}}
    known = [alloc(1), alloc(2)]
    newer_field = to_record(known[1]) | {"numa_hint": 3}  # a field a newer minor added
    records = [
        to_record(known[0]),
        {"type": "future.thing", "ts_ns": 5, "what": "?"},
        newer_field,
        {"type": "future.thing", "ts_ns": 6},
        {"type": "future.other", "ts_ns": 7},
    ]
    path = tmp_path / "t.gjtrace"
    path.write_bytes(
        preamble(1, 7)
        + frame(orjson.dumps(hdr))
        + b"".join(frame(orjson.dumps(r)) for r in records)
    )
    got, reader = read(path)
    assert got == known
    assert reader.format_version == (1, 7)
    assert reader.header.schema == (1, 9)
    assert reader.skipped == {"future.thing": 2, "future.other": 1}
    (note,) = reader.damage_notes()
    assert "skipped 3 records" in note and "future.thing (2)" in note


def test_empty_and_foreign_files_are_refused_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.gjtrace"
    empty.write_bytes(b"")
    assert "empty file" in one_line_error(empty)
    for name, content in [
        ("text", b"hello, this is not a trace\n"),
        ("jsonl", b'{"schema": "gpujitter.attribution/1"}\n'),
        ("short", b"\x89GJ"[:2] + b"x"),
        ("elf", b"\x7fELF" + bytes(100)),
    ]:
        path = tmp_path / name
        path.write_bytes(content)
        assert "not a gpujitter trace" in one_line_error(path)
    assert "No such file" in one_line_error(tmp_path / "missing.gjtrace")
    assert "not a regular file" in one_line_error(tmp_path)  # a directory
    os.mkfifo(tmp_path / "fifo.gjtrace")  # not waited on
    assert "not a regular file" in one_line_error(tmp_path / "fifo.gjtrace")


def test_malformed_but_checksummed_input_is_refused_or_skipped(tmp_path: Path) -> None:
    # Frames whose checksums hold but whose content no writer makes: in the header, the
    # file is refused; a record is skipped and reported, the records after it read.
    hdr = frame(orjson.dumps(header().to_record()))
    length_crc = struct.pack("<II", 32 << 20, 0)
    huge_frame_header = length_crc + struct.pack("<I", zlib.crc32(length_crc))
    refused = {
        "malformed trace header (not JSON": preamble() + frame(b"{not json"),
        "no 'schema'": preamble() + frame(orjson.dumps({"host": "x"})),
        "malformed trace header (thresholds: want object, got list)": preamble()
        + frame(orjson.dumps(header().to_record() | {"thresholds": [1, 2]})),
    }
    for i, (expected, raw) in enumerate(refused.items()):
        path = tmp_path / f"refused{i}"
        path.write_bytes(raw + encode(alloc(1)))  # not the last record: no torn tail
        assert expected in one_line_error(path)
    skipped = {
        "record is not JSON": frame(b"\xff\xfe"),
        "record without a type": frame(b"[1, 2]"),
        "bad sched.offcpu record": frame(orjson.dumps({"type": "sched.offcpu", "ts_ns": 1})),
    }
    for i, (expected, bad) in enumerate(skipped.items()):
        path = tmp_path / f"skipped{i}"
        path.write_bytes(preamble() + hdr + encode(alloc(1)) + bad + encode(alloc(2)))
        got, reader = read(path)
        assert got == [alloc(1), alloc(2)] and reader.corrupt == 1
        (note,) = reader.damage_notes()
        assert expected in note and "1 damaged record(s) skipped" in note
    # a length past any record's: where the next frame starts is not known
    path = tmp_path / "huge"
    path.write_bytes(preamble() + hdr + encode(alloc(1)) + huge_frame_header + bytes(64))
    got, reader = read(path)
    assert got == [alloc(1)] and reader.unread_bytes == FRAME_HEADER_SIZE + 64
    assert "larger than any writer makes" in reader.damage_notes()[0]


def test_one_damaged_file_of_a_set_costs_only_itself(tmp_path: Path) -> None:
    """One flipped bit in one segment refused the whole rotated recording (its other files'
    records with it); a segment whose header is damaged is left out, said so."""
    first = write_trace(tmp_path / "a.gjtrace", [alloc(1), alloc(2), alloc(3)])
    write_trace(tmp_path / "b.gjtrace", [alloc(4)], header(start_ns=6_000_000_000, segment=1))
    write_trace(tmp_path / "c.gjtrace", [alloc(5)], header(start_ns=7_000_000_000, segment=2))
    flipped = bytearray(first)
    flipped[frame_starts(first)[1] + FRAME_HEADER_SIZE + 3] ^= 1  # alloc(2)'s payload
    (tmp_path / "a.gjtrace").write_bytes(flipped)
    c = bytearray((tmp_path / "c.gjtrace").read_bytes())
    c[PREAMBLE_SIZE + FRAME_HEADER_SIZE + 5] ^= 1  # c's header
    (tmp_path / "c.gjtrace").write_bytes(c)
    traces = TraceSet([tmp_path])
    assert list(traces) == [alloc(1), alloc(3), alloc(4)]
    assert [p.name for p, _ in traces.unreadable] == ["c.gjtrace"]
    left_out, skipped = traces.damage
    assert "corrupt trace header (checksum mismatch)" in left_out and "left out" in left_out
    assert "a.gjtrace: 1 damaged record(s) skipped" in skipped
    # a file alone, or every file, with a damaged header: nothing to read, one line
    with pytest.raises(GpujitterError, match="corrupt trace header"):
        TraceSet([tmp_path / "c.gjtrace"])


def test_a_sessions_segments_are_read_in_their_order_whatever_the_wall_clock_did(
    tmp_path: Path,
) -> None:
    """Each segment takes the wall clock afresh: one stepped 2 h back (NTP, by hand) while a
    recording rotated was read first, and the report said the recording began 2 h early."""
    hour = 3_600_000_000_000
    clock = header().clock
    stepped = [0, -2 * hour, -2 * hour, 0]  # the wall clock's step when each segment began
    for segment, step in enumerate(stepped):
        at = dataclasses.replace(clock, realtime_ns=clock.realtime_ns + step)
        start = 5_000_000_000 + segment * 1_000_000_000
        write_trace(tmp_path / f"{segment}.gjtrace", [alloc(segment)],
                    header(clock=at, start_ns=start, segment=segment))  # fmt: skip
    # another run, later, whose clock was right
    later = dataclasses.replace(clock, realtime_ns=clock.realtime_ns + hour)
    write_trace(tmp_path / "z.gjtrace", [alloc(9)],
                header(clock=later, session="fedcba987654", start_ns=9_000_000_000))  # fmt: skip
    traces = TraceSet([tmp_path])
    # each header that found the clock set gives it before its file's events
    h = traces.headers
    assert list(traces) == [alloc(0), h[1].clock, alloc(1), alloc(2), h[3].clock, alloc(3),
                            h[4].clock, alloc(9)]  # fmt: skip
    assert traces.began == {h[n].clock: tmp_path / f"{n}.gjtrace" for n in (1, 3)} | {
        h[4].clock: tmp_path / "z.gjtrace"
    }
    assert traces.headers[0].start_wall_ns == header(start_ns=5_000_000_000).start_wall_ns


def test_writer_flushes_by_size_and_by_time_and_fsyncs_on_close(tmp_path: Path) -> None:
    path = tmp_path / "t.gjtrace"
    writer = TraceWriter(path, header(), flush_bytes=1000, flush_interval_ns=10**9)
    frame_bytes = writer.write(alloc(0))
    assert read(path)[0] == []  # buffered: a header-only trace, already readable
    while writer.size - len(path.read_bytes()) + frame_bytes < 1000:
        writer.write(alloc(1))
    before_ns = time.monotonic_ns()
    writer.write(alloc(2))  # crosses flush_bytes: everything is in the file
    after_ns = time.monotonic_ns()  # the flush happened in between
    assert len(read(path)[0]) == writer.events
    writer.write(alloc(3))
    writer.flush_if_due(now_ns=before_ns + 10**9 - 1)
    assert len(read(path)[0]) == writer.events - 1
    writer.flush_if_due(now_ns=after_ns + 10**9)
    assert len(read(path)[0]) == writer.events
    writer.write(alloc(4))
    writer.close()
    writer.close()  # idempotent
    assert len(path.read_bytes()) == writer.size
    assert read(path)[0][-1] == alloc(4)


def test_writer_refuses_an_existing_file_and_sets_mode_0640_whatever_the_umask(
    tmp_path: Path,
) -> None:
    for umask in (0o000, 0o077):
        old = os.umask(umask)
        try:
            path = tmp_path / f"t{umask}.gjtrace"
            TraceWriter(path, header()).close()
        finally:
            os.umask(old)
        assert path.stat().st_mode & 0o777 == 0o640
    with pytest.raises(GpujitterError, match="exists"):
        TraceWriter(path, header())
    assert read(path)[0] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t0.gjtrace", "t63.gjtrace"]


@pytest.mark.parametrize("unnamed", [True, False], ids=["unnamed", "named-tmp"])
def test_writer_never_writes_through_a_link_at_its_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unnamed: bool
) -> None:
    # NAME.tmp was opened O_TRUNC: a link planted there (a root daemon, a shared folder)
    # emptied its target, filled it with a trace header, made it 0640. With an unnamed
    # file the name is never used (the link stays as planted); through NAME.tmp the link
    # itself is removed.
    from gpujitter.daemon.sinks import trace as sink

    if not unnamed:
        monkeypatch.setattr(sink, "_create_unnamed", lambda directory, mode: None)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    victim.chmod(0o600)
    path = tmp_path / "t.gjtrace"
    (tmp_path / "t.gjtrace.tmp").symlink_to(victim)
    TraceWriter(path, header()).close()
    assert victim.read_bytes() == b"keep me" and victim.stat().st_mode & 0o777 == 0o600
    assert not path.is_symlink() and read(path)[0] == []
    left = ["t.gjtrace", "t.gjtrace.tmp", "victim"] if unnamed else ["t.gjtrace", "victim"]
    assert sorted(p.name for p in tmp_path.iterdir()) == left


def test_writer_never_replaces_a_file_made_at_its_name_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Between its check and its rename another recorder made the file: the rename replaced
    # it. The other recorder's file is made at the moment the header is synced (the race
    # put where it falls, on a real file system).
    path = tmp_path / "t.gjtrace"
    real_fsync = os.fsync

    def meanwhile(fd: int) -> None:
        real_fsync(fd)
        if not path.exists():
            path.write_bytes(b"the other recorder's")

    monkeypatch.setattr(os, "fsync", meanwhile)
    with pytest.raises(GpujitterError, match="exists"):
        TraceWriter(path, header())
    assert path.read_bytes() == b"the other recorder's"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.gjtrace"]


def child_writer(path: Path, fsize_limit: int = 0) -> subprocess.Popen[str]:
    return sink_writer(
        path,
        imports="""
            from gpujitter.daemon.sinks.trace import TraceWriter
            from tests.unit.test_trace_format import alloc
            from tests.unit.trace_samples import header
        """,
        open_sink="TraceWriter(path, header(), flush_bytes=700)",
        write="sink.write(alloc(i))",
        ready=50,
        fsize_limit=fsize_limit,
    )


def test_killed_writer_leaves_a_readable_prefix(tmp_path: Path) -> None:
    path = tmp_path / "t.gjtrace"
    kill_when_ready(child_writer(path))
    got, _ = read(path)
    assert len(got) >= 40  # all but the last unflushed buffer
    assert got == [alloc(i) for i in range(len(got))]


def test_failed_write_cuts_the_file_back_to_its_last_whole_record(tmp_path: Path) -> None:
    path = tmp_path / "t.gjtrace"
    child = child_writer(path, fsize_limit=3000)
    out, _ = child.communicate(timeout=60)
    assert "File too large" in out
    got, reader = read(path)
    assert reader.torn_tail_bytes == 0
    assert got == [alloc(i) for i in range(len(got))] and got


def test_long_trace_is_written_and_read_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "long.gjtrace"
    n = 40_000

    def offcpu(i: int) -> OffCpu:
        return OffCpu(
            ts_ns=i * 1000, end_ns=i * 1000 + 500, tid=i % 64, tgid=1, cpu=i % 2, cpu_in=0,
            state="sleeping", runnable_ns=i * 1000 + 400, comm="worker",
        )  # fmt: skip

    tracemalloc.start()
    try:
        with TraceWriter(path, header()) as w:
            for i in range(n):
                w.write(offcpu(i))
        _, write_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        count = 0
        with TraceReader(path) as reader:
            for count, ev in enumerate(reader, start=1):
                if count % 9973 == 0:
                    assert ev == offcpu(count - 1)
        _, read_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    size = path.stat().st_size
    # Peaks stay near the write buffer (256 KiB), an eighth of the trace or less.
    assert count == n and size > 8 << 20
    assert write_peak < 1 << 20 and read_peak < 1 << 20, (write_peak, read_peak, size)


def test_a_set_reads_in_recording_order_whatever_the_names(tmp_path: Path) -> None:
    hdr = header()
    later = dataclasses.replace(hdr, segment=1, start_ns=hdr.start_ns + 10**9)
    other_session = dataclasses.replace(hdr, session="ffff", start_ns=hdr.start_ns + 5 * 10**9)
    write_trace(tmp_path / "c.gjtrace", [alloc(1), alloc(2)], hdr)
    write_trace(tmp_path / "b.gjtrace", [alloc(3)], later)
    write_trace(tmp_path / "a.gjtrace", [alloc(4)], other_session)
    (tmp_path / "notes.txt").write_text("not a trace, not read")
    expected = [alloc(i) for i in range(1, 5)]
    for args in ([tmp_path], [str(tmp_path / "*.gjtrace")], sorted(tmp_path.glob("*.gjtrace"))):
        traces = TraceSet(args)
        assert list(traces) == expected
        assert [p.name for p in traces.paths] == ["c.gjtrace", "b.gjtrace", "a.gjtrace"]
        assert traces.damage == []
    # The same file named twice is read once.
    assert len(list(TraceSet([tmp_path / "b.gjtrace", tmp_path / "b.gjtrace"]))) == 1


def test_a_set_reports_each_files_damage_and_refuses_what_is_missing(tmp_path: Path) -> None:
    raw = write_trace(tmp_path / "a.gjtrace", [alloc(1), alloc(2)])
    (tmp_path / "a.gjtrace").write_bytes(raw[:-3])
    traces = TraceSet([tmp_path])
    assert list(traces) == [alloc(1)]
    (note,) = traces.damage
    assert "a.gjtrace: torn last record dropped" in note
    for args, message in [
        ([tmp_path / "none"], "no such file"),
        ([str(tmp_path / "*.nothing")], "no file matches"),
        ([tmp_path / "empty"], "no *.gjtrace files"),
    ]:
        (tmp_path / "empty").mkdir(exist_ok=True)
        with pytest.raises(GpujitterError, match=message.replace("*", r"\*")):
            TraceSet(args)


def test_events_survive_json_unchanged() -> None:
    # The trace stores to_record(); from_record must give back an equal event for every
    # kind, big integers and non-ASCII text included.
    for ev in every_kind():
        assert from_record(orjson.loads(orjson.dumps(to_record(ev)))) == ev


def test_a_frame_and_a_log_line_hold_the_json_of_the_events_record() -> None:
    # encode() has orjson write the dataclass itself, without building to_record's dict:
    # the bytes must be the dict's, for every kind (nested records included), or the
    # daemon's traces would stop being what readers and docs/trace-format.md expect.
    for ev in every_kind():
        assert encode(ev) == frame(orjson.dumps(to_record(ev))), ev.KIND
        lead = {"schema": "gpujitter.attribution/1"}
        assert to_json(ev, b'"schema":"gpujitter.attribution/1",') == orjson.dumps(
            {**lead, **to_record(ev)}
        ), ev.KIND


def test_two_writers_at_one_name_at_once_give_one_whole_trace_and_one_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The second recorder starts while the first syncs its header. Through NAME.tmp the
    # second took the first's temporary file, the first linked the second's in place and
    # wrote on into its own, unlinked: every event it recorded was lost without an error.
    path = tmp_path / "t.gjtrace"
    real_fsync = os.fsync
    second: list[TraceWriter] = []
    started = []

    def meanwhile(fd: int) -> None:
        real_fsync(fd)
        if not started:
            started.append(fd)
            second.append(TraceWriter(path, header()))

    monkeypatch.setattr(os, "fsync", meanwhile)
    with pytest.raises(GpujitterError, match="exists"):
        TraceWriter(path, header())
    monkeypatch.setattr(os, "fsync", real_fsync)
    (writer,) = second
    assert_the_one_trace(writer)


def assert_the_one_trace(writer: TraceWriter) -> None:
    """One event through `writer`, closed: its file holds the event and is the only file in
    its folder (no temporary name left)."""
    writer.write(alloc(1))
    writer.close()
    assert read(writer.path)[0] == [alloc(1)]
    assert [p.name for p in writer.path.parent.iterdir()] == [writer.path.name]


def test_without_unnamed_files_the_writer_goes_through_its_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpujitter.daemon.sinks import trace as sink

    monkeypatch.setattr(sink, "_create_unnamed", lambda directory, mode: None)
    assert_the_one_trace(TraceWriter(tmp_path / "t.gjtrace", header()))


def test_without_proc_the_writer_goes_through_its_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An unnamed file is linked in place through /proc/self/fd: in a chroot or a container
    # without /proc, every trace failed to be made ("cannot write ...: No such file or
    # directory") where NAME.tmp would have served.
    from gpujitter.daemon.sinks import trace as sink

    monkeypatch.setattr(sink, "_OWN_FDS", str(tmp_path / "no-proc/self/fd"))
    sink._can_name_unnamed.cache_clear()  # asked once a process: ask again here, and after
    try:
        writer = TraceWriter(tmp_path / "t.gjtrace", header())
    finally:
        sink._can_name_unnamed.cache_clear()
    assert_the_one_trace(writer)


def test_the_header_names_the_nodes_boot_and_one_without_it_reads(tmp_path: Path) -> None:
    """Each file's header carries the boot it was written in (a reboot begins the monotonic
    clock again; the readers tell a recording's boots apart by it), read from the host's
    /proc; a header of a writer before format 1.1 has none and reads as ""."""
    proc = tmp_path / "host/proc/sys/kernel/random"
    proc.mkdir(parents=True)
    (proc / "boot_id").write_text("3f9c2a7d-1e04-4b4e-9a52-6c1d0e7b8f21\n")
    made = TraceHeader.now(header().topology, ["irq"], {}, paths=HostPaths.under(tmp_path / "host"))
    assert made.boot_id == "3f9c2a7d-1e04-4b4e-9a52-6c1d0e7b8f21"
    path = tmp_path / "t.gjtrace"
    with TraceWriter(path, made) as w:
        w.write(alloc(1))
    with TraceReader(path) as reader:
        assert reader.header.boot_id == made.boot_id
        assert reader.format_version == (FORMAT_MAJOR, FORMAT_MINOR) == (1, 1)
    older = {k: v for k, v in made.to_record().items() if k != "boot_id"}
    assert TraceHeader.from_record(older).boot_id == ""
