"""The trace capture: one file or a rotating directory whose every file is a complete trace,
retention by count and size, and the event queue that feeds it from other threads."""

from __future__ import annotations

import dataclasses
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from bench.soak import RSS_GROWTH_LIMIT_BYTES as SOAK_RSS_LIMIT_BYTES
from gpujitter.daemon.service.runtime import EventQueue
from gpujitter.daemon.sinks.capture import TraceCapture
from gpujitter.daemon.sinks.rotation import Rotation
from gpujitter.daemon.sinks.trace import TraceReader, TraceSet
from gpujitter.errors import GpujitterError
from gpujitter.probes.clock import clock_ref
from gpujitter.probes.events import AllocSyscall, ClockRef, OffCpu
from gpujitter.units import format_bytes, parse_size_bytes
from tests.unit.trace_samples import header


def alloc(i: int) -> AllocSyscall:
    return AllocSyscall(
        ts_ns=i, dur_ns=i, tid=3, tgid=3, cpu=0, syscall="munmap", length=1 << 20, ret=0
    )


def record(
    target: Path, n: int, rotation: Rotation | None, session: str = "0123456789ab"
) -> TraceCapture:
    hdr = header(session=session, clock=clock_ref(), start_ns=time.monotonic_ns())
    with TraceCapture(target, hdr, rotation) as rec:
        for i in range(n):
            rec.write(alloc(i))
    return rec


def test_without_rotation_one_file_holds_everything(tmp_path: Path) -> None:
    rec = record(tmp_path / "one.gjtrace", 500, None)
    assert rec.files == [tmp_path / "one.gjtrace"]
    with TraceReader(rec.files[0]) as reader:
        assert list(reader) == [alloc(i) for i in range(500)]
    assert rec.bytes == rec.files[0].stat().st_size and rec.events == 500


def test_size_rotation_makes_complete_traces_read_back_as_one(tmp_path: Path) -> None:
    rec = record(tmp_path / "dir", 1000, Rotation(max_bytes=8192))
    files = sorted((tmp_path / "dir").iterdir())
    assert files == rec.files and len(files) > 10
    segments = []
    for path in files:
        assert path.stat().st_size <= 8192
        assert path.stat().st_mode & 0o777 == 0o640
        with TraceReader(path) as reader:  # each one a trace of its own, with a header
            assert list(reader)
            segments.append(reader.header.segment)
            assert reader.header.session == header().session
    assert segments == list(range(len(files)))
    assert list(TraceSet([tmp_path / "dir"])) == [alloc(i) for i in range(1000)]
    assert rec.bytes == sum(p.stat().st_size for p in files)
    assert (tmp_path / "dir").stat().st_mode & 0o777 == 0o750


def test_retention_by_count_keeps_the_newest_files(tmp_path: Path) -> None:
    rec = record(tmp_path / "dir", 1000, Rotation(max_bytes=8192, keep_files=3))
    kept = sorted((tmp_path / "dir").iterdir())
    assert kept == rec.files[-3:]
    assert rec.removed == rec.files[:-3]
    events = list(TraceSet(kept))
    assert events == [alloc(i) for i in range(1000 - len(events), 1000)]


def test_retention_by_size_bounds_the_directory(tmp_path: Path) -> None:
    rec = record(tmp_path / "dir", 2000, Rotation(max_bytes=8192, keep_bytes=30_000))
    kept = sorted((tmp_path / "dir").iterdir())
    assert sum(p.stat().st_size for p in kept) <= 30_000
    assert len(kept) == 3  # three files of at most 8 KiB fit, a fourth would not
    assert kept == rec.files[-3:]


def test_retention_covers_earlier_recordings_but_not_foreign_files(tmp_path: Path) -> None:
    target = tmp_path / "dir"
    first = record(target, 300, Rotation(max_bytes=4096))
    (target / "notes.txt").write_text("kept")
    (target / "mine.gjtrace").write_bytes(b"named by a person: not the capture's to delete")
    second = record(target, 50, Rotation(max_bytes=4096, keep_files=2), session="abc")
    left = sorted(p.name for p in target.iterdir())
    assert set(first.files).isdisjoint(target.iterdir())
    assert left == sorted(["notes.txt", "mine.gjtrace", *(p.name for p in second.files[-2:])])


def test_retention_after_the_clock_steps_back_keeps_this_runs_newest_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two hours back after the fourth segment: the newer segments' names sort before the
    # older ones', and retention by name deleted the files just written, keeping the old.
    made = 0

    def stepping_clock() -> ClockRef:
        nonlocal made
        made += 1
        ref = clock_ref()
        back = 2 * 3600 * 10**9 if made > 3 else 0
        return dataclasses.replace(ref, realtime_ns=ref.realtime_ns - back)

    monkeypatch.setattr("gpujitter.daemon.sinks.capture.clock_ref", stepping_clock)
    rec = record(tmp_path, 1000, Rotation(max_bytes=8192, keep_files=3))
    assert len(rec.files) > 6
    assert rec.files[4].name < rec.files[3].name  # the step is in the names
    assert sorted(tmp_path.iterdir()) == sorted(rec.files[-3:])
    events = list(TraceSet(sorted(tmp_path.iterdir())))
    assert events == [alloc(i) for i in range(1000 - len(events), 1000)]


def test_age_rotation_happens_on_tick_and_never_leaves_an_empty_file(tmp_path: Path) -> None:
    rotation = Rotation(max_age_ns=60 * 10**9)
    hdr = header()
    with TraceCapture(tmp_path / "dir", hdr, rotation) as rec:
        start = hdr.start_ns  # a file's age counts from its header's start
        rec.tick(start + 61 * 10**9)  # old but empty: kept open
        assert len(rec.files) == 1
        rec.write(alloc(1))
        rec.tick(start + 59 * 10**9)
        assert len(rec.files) == 1
        rec.tick(start + 60 * 10**9)
        assert len(rec.files) == 2
        rec.write(alloc(2))
    assert [len(list(TraceReader(p))) for p in rec.files] == [1, 1]


def test_capture_refuses_bad_targets_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(GpujitterError, match="needs a directory"):
        TraceCapture(tmp_path / "file", header(), Rotation(max_bytes=1000))
    with pytest.raises(GpujitterError, match="exists"):
        TraceCapture(tmp_path / "file", header())
    with pytest.raises(GpujitterError, match="cannot create"):
        TraceCapture(tmp_path / "file" / "sub", header(), Rotation(max_bytes=1000))


def test_rotation_policy_checks_its_limits() -> None:
    with pytest.raises(GpujitterError, match="negative"):
        Rotation(max_bytes=-1)
    with pytest.raises(GpujitterError, match="at least the file size"):
        Rotation(max_bytes=100 << 20, keep_bytes=10 << 20)
    policy = Rotation(max_bytes=1000, max_age_ns=10)
    assert not policy.due(1000, 9)
    assert policy.due(1001, 0) and policy.due(10, 10)
    assert not Rotation().due(10**12, 10**15)


def test_queue_drops_and_counts_when_the_consumer_falls_behind() -> None:
    q = EventQueue(maxsize=3)
    assert [q.emit(alloc(i)) for i in range(5)] == [True, True, True, False, False]
    assert q.dropped == 2
    assert list(q.drain()) == [alloc(0), alloc(1), alloc(2)]
    assert list(q.drain(timeout_s=0.01)) == []


def off_cpu(i: int) -> OffCpu:
    """An off-CPU interval as the sched probe decodes it: fresh integers and names."""
    t = (1 << 40) + i * 1_000
    return OffCpu(ts_ns=t, end_ns=t + 7_000, tid=1000 + i % 7, tgid=1000, cpu=0, cpu_in=1,
                  state="preempted", runnable_ns=t + 3_000, other_tid=(1 << 20) + i,
                  other_comm=f"kworker/{i % 13}:1", comm=f"pt_data_{i % 3}")  # fmt: skip


def test_a_full_queue_holds_at_most_what_the_soak_allows_for_a_backlog() -> None:
    # The soak's daemon grew 24 MiB and kept it: a stalled main loop let the queue fill
    # (65536 decoded events, ~32 MiB), and Python keeps that memory after the backlog
    # drains, as long-lived objects were allocated among the events meanwhile.
    q = EventQueue()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        i = 0
        while q.emit(off_cpu(i)):
            i += 1
        held_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert q.dropped == 1
    assert held_bytes <= SOAK_RSS_LIMIT_BYTES * 3 // 4


def test_queue_keeps_each_sources_order_across_threads() -> None:
    q = EventQueue(maxsize=1 << 20)
    per_thread = 5000

    def produce(t: int) -> None:
        for i in range(per_thread):
            q.emit(dataclasses.replace(alloc(i), tid=t))

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = []
    while batch := list(q.drain(limit=777)):
        got += batch
    assert len(got) == 4 * per_thread and q.dropped == 0
    for t in range(4):
        assert [e.ts_ns for e in got if e.tid == t] == list(range(per_thread))


def test_sizes_parse_and_print() -> None:
    assert parse_size_bytes("100M") == 100 << 20
    assert parse_size_bytes("1.5GiB") == 3 << 29
    assert parse_size_bytes("512k") == 512 << 10
    assert parse_size_bytes("4096") == 4096
    for bad in ("", "1X", "M", "-1M"):
        with pytest.raises(GpujitterError, match="bad size"):
            parse_size_bytes(bad)
    assert [format_bytes(n) for n in (512, 12_595, 5 << 20, 3 << 29)] == [
        "512B",
        "12.3KiB",
        "5.00MiB",
        "1.50GiB",
    ]


_DISK_FULL_CHILD = """
import json, resource, signal, sys
from pathlib import Path
from gpujitter.daemon.sinks.capture import TraceCapture
from tests.unit.test_capture import alloc
from tests.unit.trace_samples import header
said = []
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, hard))  # the disk is full at 30 kB
rec = TraceCapture(Path(sys.argv[1]), header(), flush_bytes=4096, say=said.append)
for i in range(1000):
    rec.write(alloc(i))
    if i % 100 == 99:
        rec.tick(10**18)  # flush now
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space returns
for i in range(1000, 1100):
    rec.write(alloc(i))
rec.tick(10**18)
rec.close()
print(json.dumps({"lost": rec.failures.dropped_total, "said": said, "events": rec.events}))
"""


def test_disk_full_loses_counted_events_and_says_so_in_the_trace(tmp_path: Path) -> None:
    """A real EFBIG (RLIMIT_FSIZE) in a child that records into a file: the capture keeps
    going, every event is either in the traces or counted as lost, the
    traces hold meta.lost records with those counts, and writing resumes when space
    returns."""
    import subprocess
    import sys

    import orjson

    from gpujitter.probes.events import RecordsLost

    done = subprocess.run(
        [sys.executable, "-c", _DISK_FULL_CHILD, str(tmp_path / "t.gjtrace")],
        capture_output=True, text=True, timeout=60, check=True,
        cwd=Path(__file__).parents[2],
    )  # fmt: skip
    out = orjson.loads(done.stdout)
    events = list(TraceSet([tmp_path / "t.gjtrace"]))
    kept = [e.ts_ns for e in events if isinstance(e, AllocSyscall)]
    markers = [e for e in events if isinstance(e, RecordsLost)]
    assert out["lost"] > 0 and len(kept) + out["lost"] == out["events"] == 1100
    assert kept == sorted(set(kept)) and kept[-100:] == list(range(1000, 1100))
    assert sum(m.count for m in markers) == out["lost"]
    assert "dropping records" in out["said"][0] and "writing again" in out["said"][-1]


def test_retention_records_on_when_an_old_file_cannot_be_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A directory named like a segment: deleting it failed and took the daemon down.
    target = tmp_path / "dir"
    target.mkdir()
    stuck = target / "gpujitter-20200101T000000.000000Z-abc-000001.gjtrace"
    stuck.mkdir()
    said: list[str] = []
    hdr = header(clock=clock_ref(), start_ns=time.monotonic_ns())
    with TraceCapture(target, hdr, Rotation(max_bytes=4096, keep_files=2), say=said.append) as rec:
        for i in range(300):
            rec.write(alloc(i))
        # The directory gone between making the next file and listing it: no retention then.
        monkeypatch.setattr(TraceCapture, "_set", lambda self: (_ for _ in ()).throw(
            FileNotFoundError(2, "No such file or directory")))  # fmt: skip
        rec.rotate()
        rec.write(alloc(300))
    assert stuck.is_dir() and stuck not in rec.removed and len(rec.files) > 5
    assert len(said) == 1 and f"cannot delete old file {stuck}: Is a directory" in said[0]
    assert not rec.failures.failing and rec.events == 301
    assert sorted(target.iterdir()) == [stuck, *rec.files[-3:]]


def test_reloads_in_a_row_push_no_recording_out(tmp_path: Path) -> None:
    # Each SIGHUP started a segment, empty or not: 8 reloads with keep 8 left 0 events.
    hdr = header(clock=clock_ref(), start_ns=time.monotonic_ns())
    with TraceCapture(tmp_path, hdr, Rotation(max_bytes=1 << 20, keep_files=3)) as rec:
        for i in range(100):
            rec.write(alloc(i))
        for _ in range(8):
            rec.rotate()
    assert len(rec.files) == 2
    assert sum(len(list(TraceReader(p))) for p in tmp_path.iterdir()) == 100


def test_retention_deletes_an_earlier_run_named_ahead_before_this_runs_files(
    tmp_path: Path,
) -> None:
    # An earlier run whose clock was years ahead: its files sorted last by name, were never
    # deleted, and each rotation deleted the segment this run had just closed instead.
    first = record(tmp_path, 300, Rotation(max_bytes=4096), session="aaa")
    for p in first.files:
        p.rename(p.with_name(p.name.replace("gpujitter-20", "gpujitter-29", 1)))
    second = record(tmp_path, 300, Rotation(max_bytes=4096, keep_files=3), session="bbb")
    assert len(second.files) > 3
    assert sorted(tmp_path.iterdir()) == sorted(second.files[-3:])
