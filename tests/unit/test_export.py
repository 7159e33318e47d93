"""`gpujitter export`: a recording as a Chrome trace-event timeline, checked for the structure
Perfetto and chrome://tracing need and for what it must show (a gap with its causes, the
thread's run-queue wait behind the task that ran instead)."""

from __future__ import annotations

import gzip
import os
import threading
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from gpujitter.cli import main
from gpujitter.daemon.offline.timeline import GPU_PID
from gpujitter.probes.clock import wall_ns
from gpujitter.probes.events import ClockRef
from tests.conftest import FIXTURES
from tests.fixtures.streams.synthetic import MS, T0
from tests.unit.trace_samples import one_gap_trace

PHASES = {"X", "C", "M"}
HOUR = 3_600_000_000_000


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return one_gap_trace(tmp_path / "one.gjtrace")


def load(path: Path) -> list[dict]:
    raw = path.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    assert doc["displayTimeUnit"] == "ms"
    return list(doc["traceEvents"])


def check_structure(events: list[dict]) -> None:
    for ev in events:
        assert ev["ph"] in PHASES and isinstance(ev["pid"], int) and isinstance(ev["tid"], int)
        if ev["ph"] == "X":
            assert ev["dur"] >= 0 and isinstance(ev["ts"], float) and ev["name"]
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "thread_name") and ev["args"]["name"]


def test_a_gap_is_a_slice_whose_children_are_its_causes(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "timeline.json"
    assert main(["export", str(trace), "-o", str(out)]) == 0
    events = load(out)
    check_structure(events)
    gpu = [e for e in events if e["ph"] == "X" and e["pid"] == GPU_PID]
    gap, *causes = sorted(gpu, key=lambda e: (e["ts"], -e["dur"]))
    assert gap["name"] == "idle 40.0 ms" and gap["ts"] == (T0 + 100 * MS) / 1000
    assert [c["args"]["cause"] for c in causes] == ["runq_wait", "host_work"]
    assert sum(c["dur"] for c in causes) == gap["dur"]
    assert all(
        gap["ts"] <= c["ts"] and c["ts"] + c["dur"] <= gap["ts"] + gap["dur"] for c in causes
    )
    assert "stress" in causes[0]["args"]["evidence"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[(GPU_PID, 0)] == "GPU0"


def test_the_feeding_thread_shows_its_wait_behind_the_task_that_ran(
    trace: Path, tmp_path: Path
) -> None:
    out = tmp_path / "timeline.json.gz"
    assert main(["export", str(trace), "-o", str(out)]) == 0
    thread = [e for e in load(out) if e["ph"] == "X" and e["pid"] != GPU_PID]
    waits = [e for e in thread if e["name"].startswith("run-queue wait")]
    assert [w["name"] for w in waits] == ["run-queue wait behind stress (tid 555)"]
    assert waits[0]["dur"] == 25 * MS / 1000
    assert waits[0]["args"]["ran_instead_ns"] == 24 * MS  # how long stress held the CPU


def test_bad_input_is_one_line(trace: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "t.json"
    out.write_text("")
    assert main(["export", str(trace), "-o", str(out)]) == 2
    assert "exists" in capsys.readouterr().err
    bad = tmp_path / "profile.json"
    bad.write_text("{")
    assert main(["export", str(trace), "-o", str(tmp_path / "u.json"), "--merge", str(bad)]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert not (tmp_path / "u.json").exists()
    assert main(["export", str(trace), "-o", ""]) == 2
    assert capsys.readouterr().err == "gpujitter export: error: -o: an empty file name\n"
    # orjson reads 1024 levels of nesting and writes 254: an internal error (exit 70) once
    # the whole trace had been replayed.
    deep = tmp_path / "deep.json"
    deep.write_text(
        '{"traceEvents": [{"ph": "i", "ts": 0, "args": ' + "[" * 300 + "]" * 300 + "}]}"
    )
    assert main(["export", str(trace), "-o", str(tmp_path / "d.json"), "--merge", str(deep)]) == 2
    err = capsys.readouterr().err
    assert "event 0 cannot be merged" in err and err.count("\n") == 1


def test_a_file_it_refuses_to_write_over_is_left_whole(trace: Path, tmp_path: Path, capsys) -> None:
    """The refusal ("exists") went through the clean-up of a failed export, which removed the
    file: another file of the user's, the recording itself given as -o, a device node."""
    kept = tmp_path / "precious.json"
    kept.write_text("the user's")
    recording = trace.read_bytes()
    for out in (kept, trace):
        assert main(["export", str(trace), "-o", str(out)]) == 2
        assert capsys.readouterr().err.endswith("exists; remove it or choose another name\n")
    assert kept.read_text() == "the user's" and trace.read_bytes() == recording
    # what cannot be created is the user's error in one line, not an internal one
    assert main(["export", str(trace), "-o", str(tmp_path / "no" / "t.json")]) == 2
    assert "cannot create" in capsys.readouterr().err


def test_a_pipe_or_a_device_is_written_through(trace: Path, tmp_path: Path) -> None:
    """-o /dev/null (a dry run) and a shell's process substitution (/dev/fd/N, a pipe) were
    refused as files that exist; they hold no one's data and are written as named."""
    assert main(["export", str(trace), "-o", "/dev/null"]) == 0
    read, write = os.pipe()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(os.fdopen(read, "rb").read()))
    reader.start()
    try:
        assert main(["export", str(trace), "-o", f"/dev/fd/{write}"]) == 0
    finally:
        os.close(write)
        reader.join()
    assert orjson.loads(got[0])["traceEvents"]


def test_what_it_says_of_the_output_is_inert(trace: Path, tmp_path: Path, capsys) -> None:
    """The summary quoted the output's name (and the damage notes the files' text) raw."""
    out = tmp_path / "run\x1b]0;pwned\x07.json"
    assert main(["export", str(trace), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert "\x1b" not in said and "run\\x1b]0;pwned\\x07.json" in said


PROFILER = FIXTURES / "profiler"
PROFILER_TRACE = PROFILER / "h200.pt.trace.json.gz"


def test_a_pytorch_profiler_trace_of_the_same_run_is_merged_on_its_clock(tmp_path: Path) -> None:
    """Recorded on the H200 (bench/profiler_trace.py): a training loop under torch.profiler
    while the daemon recorded it, with a 40 ms sleep before step 5 and 30 ms of host work
    before step 8. Merged, each gap lies between the steps it stalled (the loop's own clock
    readings, put on the profiler's clock by a pair read back to back) and no operator of
    the training thread runs inside the sleep."""
    out = tmp_path / "merged.json"
    assert main(["export", str(PROFILER / "h200-run.gjtrace"), "--merge", str(PROFILER_TRACE),
                 "-o", str(out)]) == 0  # fmt: skip
    each_gap_between_the_steps_it_stalled(load(out))


def each_gap_between_the_steps_it_stalled(events: list[dict]) -> None:
    """The recording's gaps on the profiler's clock, between the training steps of the
    fixture's run that they stalled (a sleep before step 5, host work before step 8)."""
    check_structure([e for e in events if e.get("cat") == "gpujitter"])
    profiler = PROFILER_TRACE
    truth = orjson.loads((PROFILER / "h200-steps.json").read_bytes())
    base = orjson.loads(gzip.decompress(profiler.read_bytes()))["baseTimeNanoseconds"]
    pair = truth["clocks"][0]

    def on_profiler_clock(mono_ns: int) -> float:
        return (mono_ns + pair["realtime_ns"] - pair["monotonic_ns"] - base) / 1000

    steps = {s["step"]: s for s in truth["steps"]}
    gaps = [e for e in events if e.get("pid") == GPU_PID and e["name"].startswith("idle ")]
    for before, stall in ((5, "sleep"), (8, "cpu")):
        assert steps[before]["stall_before"] == stall
        after_us = on_profiler_clock(steps[before - 1]["end_ns"])
        start_us = on_profiler_clock(steps[before]["start_ns"])
        # The loop reads its clock a little before its first launch of a step: 2 ms slack.
        (gap,) = [g for g in gaps if after_us - 2000 <= g["ts"] <= start_us]
        assert start_us - 2000 <= gap["ts"] + gap["dur"] <= start_us + 2000
    sleep = next(g for g in gaps if g["name"].startswith("idle 40"))
    thread = {e["tid"] for e in events if e.get("cat") == "user_annotation"}
    inside = [
        e for e in events
        if e.get("cat") == "cpu_op" and e.get("tid") in thread
        and sleep["ts"] + 1000 < e["ts"] < sleep["ts"] + sleep["dur"] - 1000
    ]  # fmt: skip
    assert inside == [] and any(e.get("cat") == "kernel" for e in events)


def test_a_clock_set_during_the_recording_moves_the_merge_as_it_moved_the_profiler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The recording was put on the profiler's clock by its first wall clock: a clock set an
    hour on before the profiler ran (NTP's first sync after the daemon started) put every
    gap an hour away from the steps it stalled. Each time is placed by the clock in force
    then, and the setting said; one within the profiler's span is said as such."""
    from gpujitter.daemon.sinks.trace import TraceReader, TraceWriter

    with TraceReader(PROFILER / "h200-run.gjtrace") as reader:
        header, events = reader.header, list(reader)
    true = header.clock
    for at_s, moved in ((395, HOUR), (402.3, HOUR // 7200)):  # before the profile; in it
        at = round(at_s * 1e9)
        slow = replace(true, realtime_ns=true.realtime_ns - moved)  # the clock before it
        step = ClockRef(ts_ns=at, realtime_ns=wall_ns(true, at))
        trace = tmp_path / f"set-{at_s}.gjtrace"
        n = next(n for n, ev in enumerate(events) if ev.ts_ns >= at)  # sent at its tick
        with TraceWriter(trace, replace(header, clock=slow)) as w:
            for ev in [*events[:n], step, *events[n:]]:
                w.write(ev)
        out = tmp_path / f"merged-{at_s}.json"
        assert main(["export", str(trace), "--merge", str(PROFILER_TRACE), "-o", str(out)]) == 0
        said = capsys.readouterr().out.splitlines()[1:]
        if at_s == 395:
            each_gap_between_the_steps_it_stalled(load(out))
            assert len(said) == 1
        assert said[0].startswith(f"clock: the wall clock was set +{moved / 1e9:.3f} s during")
        if at_s != 395:
            assert said[1].startswith("merge: the wall clock was set +0.500 s at 2026-12-01 ")
            assert said[1].endswith("the recording's may not line up around it")


def test_a_gil_wait_shows_on_the_thread_with_its_holder(tmp_path: Path) -> None:
    from gpujitter.daemon.sinks.trace import TraceWriter
    from tests.fixtures.streams.synthetic import TWO_NODES, Stream
    from tests.unit.trace_samples import header

    trace, out = tmp_path / "gil.gjtrace", tmp_path / "timeline.json"
    writer = TraceWriter(trace, header(topology=TWO_NODES))
    for ev in Stream().gil(100, 30, holder=102, comm="logger").ran(0, 1000).gap(100, 140).events:
        writer.write(ev)
    writer.close()
    assert main(["export", str(trace), "-o", str(out)]) == 0
    events = load(out)
    check_structure(events)
    (wait,) = [e for e in events if e["ph"] == "X" and e["name"] == "GIL wait"]
    assert wait["dur"] == 30 * MS / 1000
    assert wait["args"]["holder_tid"] == 102 and wait["args"]["holder_comm"] == "logger"
    gap_causes = [e["args"].get("cause") for e in events if e["pid"] == GPU_PID and "args" in e]
    assert "gil_wait" in gap_causes


def test_a_profiler_file_of_tiny_values_is_refused_before_its_parse(
    trace: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """30 MB of `{},` took 940 MB to parse (31 times its size, a real trace 3.3): values are
    counted before the parse and capped at what a real trace of the size limit holds."""
    from gpujitter.cli import export

    monkeypatch.setattr(export, "MAX_PROFILER_VALUES", 1000)
    tiny = tmp_path / "tiny.json"
    tiny.write_bytes(b"[" + b"{}," * 1001 + b"{}]")
    out = tmp_path / "t.json"
    assert main(["export", str(trace), "-o", str(out), "--merge", str(tiny)]) == 2
    assert "more than 1,000 JSON values" in capsys.readouterr().err
    assert not out.exists()


def test_a_profiler_file_whose_compressed_data_is_damaged_is_one_line(
    trace: Path, tmp_path: Path, capsys
) -> None:
    """A gzip header over data that is no deflate stream: zlib's own error, which is no
    OSError, ended the command as an internal error (70)."""
    damaged = tmp_path / "run.pt.trace.json.gz"
    damaged.write_bytes(gzip.compress(b"{}")[:10] + b"\xff" * 8)
    out = tmp_path / "t.json"
    assert main(["export", str(trace), "-o", str(out), "--merge", str(damaged)]) == 2
    err = capsys.readouterr().err
    assert "invalid block type" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
