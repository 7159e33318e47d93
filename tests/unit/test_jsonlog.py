"""The attribution log: one schema-tagged JSON line per record, O_APPEND, mode 0640, torn last
lines cut on reopen, rotation with retention, reopen after logrotate."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from gpujitter.daemon.analysis.records import GpuGap
from gpujitter.daemon.sinks import jsonlog
from gpujitter.daemon.sinks.jsonlog import (
    DROPPED,
    LOG_SCHEMA,
    MAX_LINE_BYTES,
    JsonLog,
    JsonLogReader,
    rotated_files,
)
from gpujitter.daemon.sinks.rotation import Rotation
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import ClockRef, from_record
from tests.unit.sink_child import kill_when_ready, sink_writer


def gap(i: int) -> GpuGap:
    return GpuGap(
        ts_ns=i * 10**6, end_ns=i * 10**6 + 40_000, gpu=i % 8, sources=("cuda",),
        resolution_ns=1000, confidence=0.9, tgids=(4121,),
    )  # fmt: skip


def lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_one_line_per_record_each_with_its_schema(tmp_path: Path) -> None:
    path = tmp_path / "attributions.jsonl"
    with JsonLog(path) as log:
        log.write(gap(1))
        log.write({"type": "note", "gap": "0:1", "causes": {"swap": 12}})  # not an event kind
    raw = lines(path)
    assert len(raw) == 2 and all(line.endswith(b"\n") for line in raw)
    first = orjson.loads(raw[0])
    assert (
        next(iter(first)) == "schema" and first["schema"] == LOG_SCHEMA == "gpujitter.attribution/1"
    )
    assert from_record(first) == gap(1)  # the schema key is not a field: dropped
    assert list(JsonLogReader(path))[1] == {
        "schema": LOG_SCHEMA, "type": "note", "gap": "0:1", "causes": {"swap": 12},
    }  # fmt: skip


def test_a_line_says_its_records_start_by_the_wall_clock_of_the_moment(tmp_path: Path) -> None:
    """With a clock, each line carries `time` (RFC 3339, UTC, µs) after its schema, by the
    clock it is given then; readers keep going by ts_ns (the record read back is the one
    written)."""
    path = tmp_path / "attributions.jsonl"
    start = ClockRef(ts_ns=10**6, realtime_ns=1_796_644_867_250_123_000)  # 2026-12-07T12:01:07
    with JsonLog(path) as log:
        log.write(gap(1))  # no clock: no time
        log.clock = start
        log.write(gap(1))
        log.write({"type": "note", "ts_ns": 2 * 10**6})
        log.clock = ClockRef(ts_ns=3 * 10**6, realtime_ns=start.realtime_ns + 3_600 * 10**9)
        log.write(gap(3))  # the clock set an hour on meanwhile
    first, second, note, third = (orjson.loads(line) for line in lines(path))
    assert "time" not in first
    assert list(second)[:3] == ["schema", "time", "type"]
    assert second["time"] == "2026-12-07T12:01:07.250123Z" and from_record(second) == gap(1)
    assert note["time"] == "2026-12-07T12:01:07.251123Z"
    assert third["time"] == "2026-12-07T13:01:07.250123Z" and from_record(third) == gap(3)
    read = [r.get("time") for r in JsonLogReader(path)]
    assert read == [None, second["time"], note["time"], third["time"]]


def test_file_mode_is_0640_whatever_the_umask_and_the_fd_appends(tmp_path: Path) -> None:
    for umask in (0o000, 0o077):
        old = os.umask(umask)
        try:
            log = JsonLog(tmp_path / f"{umask}.jsonl")
        finally:
            os.umask(old)
        assert (tmp_path / f"{umask}.jsonl").stat().st_mode & 0o777 == 0o640
        # Appending: a line lands after what another writer added meanwhile, never over it.
        log.write(gap(1))
        with (tmp_path / f"{umask}.jsonl").open("ab") as other:
            other.write(b'{"type": "note"}\n')
        log.write(gap(2))
        log.close()
        lines = (tmp_path / f"{umask}.jsonl").read_bytes().splitlines()
        assert lines[1] == b'{"type": "note"}' and from_record(orjson.loads(lines[2])) == gap(2)
    # An existing file keeps the mode its owner gave it.
    existing = tmp_path / "63.jsonl"
    existing.chmod(0o600)
    JsonLog(existing).close()
    assert existing.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("torn", [b'{"schema": "gpujitter.attr', b"x" * 200_000])
def test_torn_last_line_is_skipped_by_readers_and_cut_on_reopen(
    tmp_path: Path, torn: bytes
) -> None:
    path = tmp_path / "a.jsonl"
    with JsonLog(path) as log:
        for i in range(3):
            log.write(gap(i))
    with open(path, "ab") as f:
        f.write(torn)  # a crash in the middle of a write
    reader = JsonLogReader(path)
    assert [from_record(r) for r in reader] == [gap(0), gap(1), gap(2)]
    assert reader.torn_bytes == len(torn)
    with JsonLog(path) as log:
        assert log.repaired_bytes == len(torn)
        log.write(gap(3))
    assert [from_record(r) for r in JsonLogReader(path)] == [gap(i) for i in range(4)]
    assert all(orjson.loads(line) for line in lines(path))


def test_a_file_holding_only_a_torn_line_is_emptied(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"schema"')
    with JsonLog(path) as log:
        assert log.repaired_bytes == 9 and log.size == 0
        log.write(gap(0))
    assert len(lines(path)) == 1


def test_readers_skip_damaged_lines_and_read_on(tmp_path: Path) -> None:
    """A bit flip or a crash's zeros in the middle of a log cost the lines they hit, not the
    records after them (as a trace's damaged records): counted and named, the first."""
    path = tmp_path / "a.jsonl"
    with JsonLog(path) as log:
        for i in range(4):
            log.write(gap(i))
    good = path.read_bytes().splitlines(keepends=True)
    damaged = [
        b'{"schema": "gpuj\n',  # cut short, the next line's start past it
        good[1].replace(b'"gpu":1', b'"gpu":"1"'),  # a field of the wrong type
        b"\0" * (MAX_LINE_BYTES + 5) + good[2],  # zeros with no newline, then a line
        orjson.dumps({"schema": LOG_SCHEMA, "type": 7}) + b"\n",
    ]
    path.write_bytes(good[0] + b"".join(damaged) + good[3])
    reader = JsonLogReader(path)
    assert [from_record(r) for r in reader] == [gap(0), gap(3)]
    # the zeros overwrote a line's start and its newline (here gap 2's): four lines read as
    # damaged, and the bytes say what they held (a record is some 200 bytes)
    assert reader.damage_notes() == [
        f"{path}: 4 damaged line(s) skipped, the first: line 2, not a JSON line; "
        f"{sum(map(len, damaged))} bytes in all, {MAX_LINE_BYTES + 5} of them zeros (a "
        "crash's block that never reached the disk: the records it overwrote are lost, how "
        "many is not known); the file is damaged"
    ]
    path.write_bytes(good[0] + good[1].replace(b'"gpu":1', b'"gpu":"1"') + good[2])
    assert len(list(reader)) == 2
    assert (
        "the first: line 2, bad gpu.gap record: gpu: want int, got str"
        in (reader.damage_notes()[0])
    )
    path.write_bytes(b"".join(good))
    assert len(list(reader)) == 4 and reader.damage_notes() == []


def test_readers_refuse_other_schemas_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    ok = orjson.dumps({"schema": LOG_SCHEMA, "type": "x"}) + b"\n"
    for content, message in [
        (ok + b'{"type": "x"}\n', ":2: not a gpujitter.attribution/N record"),
        (
            b'{"schema": "gpujitter.attribution/2"}\n',
            ":1: record of schema gpujitter.attribution/2",
        ),
    ]:
        path.write_bytes(content)
        with pytest.raises(GpujitterError) as err:
            list(JsonLogReader(path))
        assert message in str(err.value) and "\n" not in str(err.value)
    # JSON that is no object is a damaged line, as a line that is no JSON is: it stopped the
    # whole read with the refusal of another file's line
    path.write_bytes(ok + b"null\n[1]\n" + ok)
    reader = JsonLogReader(path)
    assert len(list(reader)) == 2
    assert (
        "2 damaged line(s) skipped, the first: line 2, not a JSON object"
        in (reader.damage_notes()[0])
    )
    with pytest.raises(GpujitterError, match="cannot open log"):
        list(JsonLogReader(tmp_path / "missing.jsonl"))


def test_size_rotation_keeps_numbered_files_newest_first(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with JsonLog(path, Rotation(max_bytes=2000, keep_files=4)) as log:
        for i in range(300):
            log.write(gap(i))
    files = rotated_files(path)
    assert [p.name for p in files] == ["a.jsonl.3", "a.jsonl.2", "a.jsonl.1", "a.jsonl"]
    assert not (tmp_path / "a.jsonl.4").exists()
    assert all(p.stat().st_size <= 2000 for p in files)
    assert all(p.stat().st_mode & 0o777 == 0o640 for p in files)
    got = [from_record(r) for r in JsonLogReader(path, rotated=True)]
    assert got == [gap(i) for i in range(300 - len(got), 300)] and len(got) > 20


def test_size_retention_bounds_the_total(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    with JsonLog(path, Rotation(max_bytes=2000, keep_bytes=7000)) as log:
        for i in range(300):
            log.write(gap(i))
            assert sum(p.stat().st_size for p in rotated_files(path)) <= 7000
    assert len(rotated_files(path)) == 3


def test_reopen_after_logrotate_moved_the_file(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonLog(path)
    log.write(gap(0))
    path.rename(tmp_path / "a.jsonl-20250101")  # what logrotate does before SIGHUP
    log.write(gap(1))  # still the old file until reopened
    log.reopen()
    log.write(gap(2))
    log.close()
    old = [from_record(r) for r in JsonLogReader(tmp_path / "a.jsonl-20250101")]
    assert old == [gap(0), gap(1)]
    assert [from_record(r) for r in JsonLogReader(path)] == [gap(2)]
    assert path.stat().st_mode & 0o777 == 0o640
    with pytest.raises(GpujitterError, match="after close"):
        log.write(gap(3))


def test_threads_never_interleave_inside_a_line(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    log = JsonLog(path, Rotation(max_bytes=50_000))

    def writer(t: int) -> None:
        for i in range(1500):
            log.write({"type": "t", "thread": t, "i": i, "pad": "x" * (i % 300)})

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    records = list(JsonLogReader(path, rotated=True))
    assert len(records) == 6000
    for t in range(4):
        assert [r["i"] for r in records if r["thread"] == t] == list(range(1500))


def child(path: Path) -> subprocess.Popen[str]:
    return sink_writer(
        path,
        imports="from gpujitter.daemon.sinks.jsonlog import JsonLog",
        open_sink="JsonLog(path)",
        write='sink.write({"type": "t", "i": i, "pad": "y" * 97})',
        ready=200,
    )


def test_killed_writer_leaves_only_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    kill_when_ready(child(path))
    records = list(JsonLogReader(path))
    assert [r["i"] for r in records] == list(range(len(records))) and len(records) >= 200


_DISK_FULL_CHILD = """
import json, resource, signal, sys
from gpujitter.daemon.sinks.jsonlog import JsonLog
said = []
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (5000, hard))  # the disk is full at 5000 bytes
log = JsonLog(sys.argv[1], say=said.append)
ok = [log.write({"type": "t", "i": i, "pad": "y" * 97}) for i in range(100)]
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space returns
ok += [log.write({"type": "t", "i": i, "pad": "y" * 97}) for i in range(100, 110)]
log.close()
print(json.dumps({"ok": ok, "dropped": log.failures.dropped_total, "said": said}))
"""


def test_disk_full_drops_counts_says_once_and_recovers(tmp_path: Path) -> None:
    """A real EFBIG from the kernel (RLIMIT_FSIZE) in a child: writing goes on, each refused
    record is counted, the operator is told once when it starts and once when it ends, and
    the first line after the stretch says how many records it cost."""
    path = tmp_path / "a.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", _DISK_FULL_CHILD, str(path)],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    out = orjson.loads(done.stdout)
    reader = JsonLogReader(path)
    records = list(reader)
    assert reader.torn_bytes == 0 and path.read_bytes().endswith(b"\n")
    written = [r["i"] for r in records if r["type"] == "t"]
    notices = [r for r in records if r["type"] == DROPPED]
    assert out["ok"].count(False) == out["dropped"] > 0
    assert len(written) + out["dropped"] == 110 and written[-10:] == list(range(100, 110))
    assert [n["count"] for n in notices] == [out["dropped"]]
    assert notices[0]["reason"].startswith(f"cannot write log {path}")
    assert len(out["said"]) == 2 and "dropping records" in out["said"][0]
    assert f"{out['dropped']} records were dropped" in out["said"][1]


def test_room_for_the_drop_note_but_not_the_record_is_no_recovery(tmp_path: Path) -> None:
    """Records larger than the room left: the short drop note alone fit, so writing was said
    to work again at once while the record behind it was refused, and the drops after that
    went unsaid (found with the log on a full tmpfs: "writing again; 1 records were
    dropped", then ~500 dropped in silence). The note goes with its record now."""
    path = tmp_path / "a.jsonl"
    child = _DISK_FULL_CHILD.replace('"y" * 97', '"y" * 1900').replace("range(100)", "range(10)")
    child = child.replace("range(100, 110)", "range(10, 12)")
    done = subprocess.run([sys.executable, "-c", child, str(path)],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    out = orjson.loads(done.stdout)
    assert out["ok"] == [True] * 2 + [False] * 8 + [True] * 2
    assert len(out["said"]) == 2 and "dropping records" in out["said"][0]
    assert "8 records were dropped" in out["said"][1]
    records = list(JsonLogReader(path))
    assert [r["type"] for r in records] == ["t", "t", DROPPED, "t", "t"]
    assert records[2]["count"] == 8


def test_a_line_shown_with_tail_carries_no_control_character(tmp_path: Path) -> None:
    """Names are other processes' choice: the C1 controls, DEL and bidi overrides that orjson
    leaves raw are written as \\u escapes, so `tail -f` on the log cannot drive the terminal;
    the value read back is the name itself."""
    path = tmp_path / "attributions.jsonl"
    comm = "\x9b2J\u202e\x7f\x1b]0;t\x07"
    with JsonLog(path) as log:
        log.write({"type": "gpu.attribution", "comm": comm})
    text = path.read_text()
    assert [ch for ch in text.rstrip("\n") if not ch.isprintable()] == []
    assert orjson.loads(text)["comm"] == comm


def test_rotation_writes_on_when_an_old_file_cannot_be_deleted(tmp_path: Path) -> None:
    # A directory named like a rotated file: deleting it failed and took the daemon down.
    path = tmp_path / "a.jsonl"
    (tmp_path / "a.jsonl.1").mkdir()
    (tmp_path / "a.jsonl.1" / "keepme").write_text("someone's")
    said: list[str] = []
    with JsonLog(path, Rotation(max_bytes=2000, keep_files=2), say=said.append) as log:
        assert all(log.write(gap(i)) for i in range(100))
    assert len(said) == 1 and "cannot delete old file" in said[0] and "Is a directory" in said[0]
    assert [p.read_text() for p in tmp_path.glob("a.jsonl.*/keepme")] == ["someone's"]
    assert from_record(list(JsonLogReader(path))[-1]) == gap(99)


@pytest.mark.parametrize(
    "content",
    [
        b"DATA!",  # a short file that is no record
        b"\0" * (8 << 20) + b"DATA!",  # a run without a newline longer than any record
        orjson.dumps({"schema": LOG_SCHEMA, "type": "x"}) + b"\n" + b"y" * (MAX_LINE_BYTES + 1),
        # someone else's file at a mistyped path: it was appended to, its last line cut
        b"127.0.0.1 localhost\n::1 localhost",
        b"127.0.0.1 localhost\n",
        b'{"schema":"gpujitter.trace/1"}\n',  # another gpujitter file is no log either
    ],
)
def test_a_file_that_is_no_log_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    # It was cut back to its last newline, however far: a 3 GB data file went to nothing.
    path = tmp_path / "a.jsonl"
    path.write_bytes(content)
    with pytest.raises(GpujitterError, match="not a gpujitter log"):
        JsonLog(path)
    assert path.read_bytes() == content
    # After logrotate (SIGHUP) the same: the sink fails, says so, and the file stays.
    other = tmp_path / "b.jsonl"
    said = reopened_onto(other, lambda: other.write_bytes(content))
    assert len(said) == 1 and "not a gpujitter log" in said[0]
    assert other.read_bytes() == content


def reopened_onto(path: Path, plant: Callable[[], object]) -> list[str]:
    """What a log at `path` says when, after logrotate moved it, `plant` puts something
    at its name before the reload; the write after it must fail."""
    said: list[str] = []
    with JsonLog(path, say=said.append) as log:
        path.rename(path.with_name(path.name + "-old"))
        plant()
        log.reopen()
        assert not log.write(gap(1))
    return said


def test_a_link_at_the_log_path_is_never_written_through(tmp_path: Path) -> None:
    # The daemon runs as root: a link planted at its log's name (at start, or between
    # logrotate's rename and the reload) had it append to, and cut the tail of, the target.
    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    path = tmp_path / "a.jsonl"
    path.symlink_to(victim)
    with pytest.raises(GpujitterError, match=r"a\.jsonl: a symbolic link"):
        JsonLog(path)
    other = tmp_path / "b.jsonl"
    said = reopened_onto(other, lambda: other.symlink_to(victim))
    assert victim.read_bytes() == b""
    assert len(said) == 1 and "symbolic link" in said[0]


def test_a_fifo_at_the_log_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    os.mkfifo(path)
    with pytest.raises(GpujitterError, match="not a regular file"):
        JsonLog(path)


def test_a_log_that_cannot_be_renamed_is_written_on_and_rotated_later(tmp_path: Path) -> None:
    # Its folder made read-only under the daemon: each rotation failed, every record was
    # dropped into a file that could still be written, and each one said two lines.
    folder = tmp_path / "logs"
    folder.mkdir()
    path = folder / "a.jsonl"
    said: list[str] = []
    log = JsonLog(path, Rotation(max_bytes=2000, keep_files=3), say=said.append)
    log.write(gap(0))  # the file is open: lines go on through it on a read-only mount
    subprocess.run(["mount", "--bind", folder, folder], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", folder], check=True)
        assert all(log.write(gap(i)) for i in range(1, 100))
    finally:
        subprocess.run(["umount", folder], check=True)
    assert log.failures.dropped_total == 0 and rotated_files(path) == [path]
    assert len(said) == 1 and "cannot rotate log" in said[0] and "Read-only" in said[0]
    assert [from_record(r) for r in JsonLogReader(path)] == [gap(i) for i in range(100)]
    log._rotate_after_ns = 0  # the retry a minute on, now
    assert log.write(gap(100))
    log.close()
    assert len(rotated_files(path)) == 2 and said[1].endswith("rotated again")
    assert [from_record(r) for r in JsonLogReader(path)] == [gap(100)]


@pytest.fixture
def log_in_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[JsonLog, Path, list[str]]:
    """A log at logs/a.jsonl that asks at every write whether its file is still there (not
    each second), and the lines it said."""
    monkeypatch.setattr(jsonlog, "_GONE_CHECK_NS", 0)
    (tmp_path / "logs").mkdir()
    said: list[str] = []
    return JsonLog(tmp_path / "logs" / "a.jsonl", say=said.append), tmp_path / "logs", said


def test_a_deleted_log_is_opened_again_and_a_missing_folder_counted(
    log_in_a_folder: tuple[JsonLog, Path, list[str]],
) -> None:
    # Lines went into the unlinked file, each write said True, nothing was counted.
    log, folder, said = log_in_a_folder
    path = log.path
    assert log.write(gap(0))
    path.unlink()
    assert log.write(gap(1))
    assert [from_record(r) for r in JsonLogReader(path)] == [gap(1)]
    path.unlink()
    folder.rmdir()
    assert not log.write(gap(2))
    assert log.failures.dropped_total == 1
    assert "was deleted" in said[0] and "cannot open log" in said[-1]
    folder.mkdir()
    assert log.write(gap(3))
    log.close()
    assert [r["type"] for r in JsonLogReader(path)] == [DROPPED, "gpu.gap"]


def test_failures_of_other_kinds_in_a_minute_are_each_said(
    log_in_a_folder: tuple[JsonLog, Path, list[str]], tmp_path: Path
) -> None:
    # The log's folder removed, then a folder, a link and a FIFO put at its name within a
    # minute: only the first failure was said, the rest showed only in the status.
    log, folder, said = log_in_a_folder
    path = log.path
    put_there = [
        lambda: folder.rmdir(),
        lambda: path.mkdir(),
        lambda: path.symlink_to(tmp_path / "victim"),
        lambda: os.mkfifo(path),
    ]
    for n, put in enumerate(put_there):
        assert log.write(gap(2 * n))
        path.unlink()
        put()
        assert not log.write(gap(2 * n + 1))
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            folder.mkdir()
    assert log.write(gap(8))
    log.close()
    failed = [line.split(": ", 1)[1] for line in said if "dropping records" in line]
    assert failed == [
        "No such file or directory; dropping records until writes succeed again",
        "Is a directory; dropping records until writes succeed again",
        "a symbolic link (give the file's own path); dropping records until writes succeed again",
        "not a regular file; dropping records until writes succeed again",
    ]
    assert sum("writing again; 1 records were dropped" in line for line in said) == 4


def test_a_log_another_daemon_writes_is_refused(tmp_path: Path) -> None:
    # Two daemons on one log.path: both started, their lines and rotations interleaved.
    path = tmp_path / "a.jsonl"
    with JsonLog(path) as first:
        with pytest.raises(GpujitterError, match="another gpujitter daemon writes it"):
            JsonLog(path)
        assert jsonlog.in_use(path)
        first.write(gap(0))
    assert not jsonlog.in_use(path)
    with JsonLog(path) as again:  # the lock goes with the writer
        again.write(gap(1))
