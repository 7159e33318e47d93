"""Every record is type-checked on read: fields of the wrong type in a trace or an attribution
log are refused in one line naming where, never a traceback or a wrong row. A seeded,
structure-aware fuzzer changes field types inside real records and keeps the checksums valid."""

from __future__ import annotations

import contextlib
import io
import json
import random
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpujitter.cli import build_parser, main, report, trace
from gpujitter.daemon.analysis.pipeline import AnalysisConfig
from gpujitter.daemon.sinks.jsonlog import JsonLog
from gpujitter.daemon.sinks.trace import PREAMBLE_SIZE, TraceWriter, frame, preamble
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import GPUS_MAX, Event, from_record, to_record
from gpujitter.tui.feeds.replay import read_recording
from gpujitter.tui.model import NodeModel
from tests.unit.trace_samples import every_kind, header

REAL_EVENTS = Path(__file__).parents[1] / "fixtures" / "gaps" / "h200-power-dip-events.ndjson"
# What a field can wrongly hold: other JSON types, a bool for a number, a float for an int,
# integers past 64 bits (read back as floats), lists and objects of the wrong shape.
WRONG = ["x", "", "12", None, True, 1.5, -1, 2**64 - 1, 2**80, [], [1, "x"], {}, {"a": 1}]


def events() -> list[Event]:
    """A real NVML stream with a power dip (so `report` finds and attributes a gap) and one
    event of every kind (nested attribution records included)."""
    real = [from_record(orjson.loads(line)) for line in REAL_EVENTS.read_bytes().splitlines()]
    return real[::10] + every_kind()


def write_trace(path: Path) -> list[bytes]:
    """The trace's frame payloads, header first."""
    hdr = header(analysis=AnalysisConfig().to_record())
    with TraceWriter(path, hdr) as w:
        for ev in events():
            w.write(ev)
    raw = path.read_bytes()
    payloads, off = [], PREAMBLE_SIZE
    while off < len(raw):
        (length,) = struct.unpack_from("<I", raw, off)
        payloads.append(raw[off + 12 : off + 12 + length])
        off += 12 + length
    return payloads


def slots(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON value that a mutation may replace (not the record's own type)."""
    if path:
        yield path
    if isinstance(value, dict | list):
        for key, sub in value.items() if isinstance(value, dict) else enumerate(value):
            if path or key != "type":
                yield from slots(sub, (*path, key))


def mutate(rec: Any, rng: random.Random) -> tuple[Any, str]:
    """A copy of `rec` with one value, anywhere inside it, replaced by one of another type."""
    rec = json.loads(json.dumps(rec))
    path = rng.choice(list(slots(rec)))
    wrong = rng.choice(WRONG)
    parent = rec
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = wrong
    return rec, f"{'.'.join(map(str, path))} = {wrong!r}"


# `trace` and `report` as main() runs them, with the parser built once: building it costs
# more than reading the trace.
PARSER = build_parser([trace.COMMAND, report.COMMAND])


def run_command(*argv: str) -> tuple[int, str]:
    """(exit status, error line) of one command, its output thrown away."""
    args = PARSER.parse_args(argv)
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            return int(args.run(args)), ""
        except GpujitterError as err:
            return 2, str(err)


def test_ill_typed_fields_are_refused_by_from_record_naming_the_field() -> None:
    ok = {"type": "malloc.syscall", "ts_ns": 1, "dur_ns": 2, "tid": 3, "tgid": 3, "cpu": 0}
    ok |= {"syscall": "mmap", "length": 4096, "ret": 0}
    assert from_record(ok).tid == 3
    for field, value, message in [
        ("tid", "3", "tid: want int, got str"),
        ("tid", True, "tid: want int, got bool"),
        ("tid", 3.0, "tid: want int, got float"),
        ("ret", None, "ret: want int, got null"),
        ("syscall", 7, "syscall: want str, got int"),
    ]:
        with pytest.raises(ValueError, match=f"bad malloc.syscall record: {message}"):
            from_record(ok | {field: value})
    sample = {"type": "gpu.sample", "ts_ns": 1, "gpu": 0, "metric": "util", "period_ns": 1}
    assert from_record(sample | {"value": 3}).value == 3.0  # a float field takes an int
    attribution = next(e for e in every_kind() if e.KIND == "gpu.attribution")
    rec = orjson.loads(orjson.dumps(to_record(attribution)))
    assert from_record(rec) == attribution
    rec["parts"][0]["evidence"][0]["count"] = "many"
    with pytest.raises(ValueError, match=r"parts\[0\]\.evidence\[0\]\.count: want int, got str"):
        from_record(rec)
    with pytest.raises(ValueError, match="not an object"):
        from_record([1, 2])  # type: ignore[arg-type]


def test_a_well_typed_gap_or_attribution_that_no_detector_gives_is_refused_by_from_record() -> None:
    # The one decoder that the trace reader, the attribution log's reader and the TUI share:
    # what it lets through a view shows as measured ("±-5ns", "-4000000000%").
    kinds = {e.KIND: orjson.loads(orjson.dumps(to_record(e))) for e in every_kind()}
    gap, attribution = kinds["gpu.gap"], kinds["gpu.attribution"]
    assert attribution["parts"] and attribution["threads"] and attribution["threads"][0]["causes"]
    for rec in (gap, attribution):
        assert from_record(rec).problem() is None
        for field, value, message in [
            ("resolution_ns", -5, "resolution_ns: negative"),
            ("confidence", -3.0, "confidence: outside 0..1"),
            ("confidence", 1.5, "confidence: outside 0..1"),
            ("end_ns", rec["ts_ns"] - 1, r"end_ns \d+ before ts_ns"),
        ]:
            with pytest.raises(ValueError, match=f"bad {rec['type']} record: {message}"):
                from_record(rec | {field: value})
        assert from_record(rec | {"confidence": 0, "resolution_ns": 0}).problem() is None
    for place, message in [
        (("self_ns",), r"self_ns: negative"),
        (("parts", 0, "ns"), r"parts\[0\]\.ns: negative"),
        (("threads", 0, "ns"), r"threads\[0\]\.ns: negative"),
        (("threads", 0, "hops"), r"threads\[0\]\.hops: negative"),
        (("threads", 0, "causes", 0, "ns"), r"threads\[0\]\.causes\[0\]\.ns: negative"),
    ]:
        bad = json.loads(json.dumps(attribution))
        parent = bad
        for key in place[:-1]:
            parent = parent[key]
        parent[place[-1]] = -1
        with pytest.raises(ValueError, match=message):
            from_record(bad)


def test_times_no_clock_gives_are_refused_for_every_kind() -> None:
    """CLOCK_MONOTONIC is never negative and no span ends before it begins: a made-up line
    with ts_ns -5 read as a gap of 324 s, an off-CPU interval ending before its start was
    taken in."""
    for ev in every_kind():
        rec = orjson.loads(orjson.dumps(to_record(ev)))
        with pytest.raises(ValueError, match=r"ts_ns: negative \(-5\)"):
            from_record(rec | {"ts_ns": -5})
        if "end_ns" in rec:
            with pytest.raises(ValueError, match=r"end_ns \d+ before ts_ns"):
                from_record(rec | {"end_ns": rec["ts_ns"] - 1})
        # decades past a boot, by itself or at its end (one such event moved the engine's
        # clock past every other): 2**60 ns is 36 years
        spans = "end_ns" in rec
        far = [{"ts_ns": 2**62} | ({"end_ns": 2**62} if spans else {}), {"end_ns": 2**60 + 1}]
        for change in [*far, {"dur_ns": 2**61}, {"interval_ns": 2**61}]:
            if change.keys() <= rec.keys():
                with pytest.raises(ValueError, match=r"ends at \d+ ns, decades past any boot"):
                    from_record(rec | change)
        for name in ("dur_ns", "interval_ns"):  # a duration is never negative either
            if name in rec:
                with pytest.raises(ValueError, match=f"{name}: negative \\(-1\\)"):
                    from_record(rec | {name: -1})
        span = rec["end_ns"] - rec["ts_ns"] if spans else 0  # kept: an attribution's parts fill it
        late = {"ts_ns": 2**59} | ({"end_ns": 2**59 + span} if spans else {})
        assert from_record(rec | late).ts_ns == 2**59  # 18 years: kept


def test_a_gpu_index_no_node_has_is_refused() -> None:
    """A crafted events file of 300,000 GPU indexes took 1.2 GB of report's memory (state
    per GPU): an index is 0 to GPUS_MAX - 1, or -1 for a GPU not known."""
    kinds = [orjson.loads(orjson.dumps(to_record(e))) for e in every_kind()]
    with_gpu = [rec for rec in kinds if "gpu" in rec]
    assert {rec["type"] for rec in with_gpu} >= {"gpu.sample", "gpu.gap", "gpu.attribution"}
    for rec in with_gpu:
        for gpu in (-1, 0, GPUS_MAX - 1):
            assert from_record(rec | {"gpu": gpu}).gpu == gpu  # type: ignore[attr-defined]
        for gpu in (-2, GPUS_MAX, 300_000):
            with pytest.raises(ValueError, match=f"gpu: {gpu}, no GPU index"):
                from_record(rec | {"gpu": gpu})


def test_a_total_longer_than_the_span_it_was_counted_in_is_refused() -> None:
    """An irq.stolen of 2**64-1 ns (a crafted or damaged line) read a recording's 1.3 ms of
    IRQ time as 323 ms; handlers or faults counted between two times took no more than the
    time between them, and no count or total is negative."""
    for ev in every_kind():
        rec = orjson.loads(orjson.dumps(to_record(ev)))
        if rec["type"] not in ("irq.stolen", "fault.minor"):
            continue
        span = rec["end_ns"] - rec["ts_ns"]
        assert from_record(rec | {"total_ns": span}).problem() is None  # one handler: all of it
        for change, said in [
            ({"total_ns": span + 1}, f"total_ns {span + 1} longer than its span"),
            ({"total_ns": 2**64 - 1}, "longer than its span"),
            ({"total_ns": -1}, "negative"),
            ({"count": -1}, "negative"),
        ]:
            with pytest.raises(ValueError, match=said):
                from_record(rec | change)


def test_an_unmeasurable_attribution_in_a_trace_is_damage_not_a_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payloads = write_trace(tmp_path / "real.gjtrace")
    index = next(i for i, p in enumerate(payloads) if b'"gpu.attribution"' in p)
    rec = orjson.loads(payloads[index])
    rec["confidence"] = -40000000.0
    path = tmp_path / "bad.gjtrace"
    mutated = [*payloads[:index], orjson.dumps(rec), *payloads[index + 1 :]]
    path.write_bytes(preamble() + b"".join(map(frame, mutated)))
    assert main(["trace", str(path)]) == 1
    out = capsys.readouterr().out
    assert "1 damaged record(s) skipped" in out and "confidence: outside 0..1" in out


def test_an_ill_typed_record_is_damage_named_by_file_record_kind_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payloads = write_trace(tmp_path / "real.gjtrace")
    rec = orjson.loads(payloads[3]) | {"ts_ns": "soon"}
    path = tmp_path / "bad.gjtrace"
    path.write_bytes(preamble() + b"".join(map(frame, [*payloads[:3], orjson.dumps(rec)])))
    offset = len(preamble()) + sum(len(frame(p)) for p in payloads[:3])
    where = f"record 2: bad {rec['type']} record: ts_ns: want int, got str at byte {offset}"
    note = f"1 damaged record(s) skipped, the first: {where}; the trace is damaged"
    assert main(["trace", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"damage: {note}" in out and "2 events" in out
    # report reads the rest and says what it skipped (it refused the whole recording)
    assert main(["report", str(path)]) == 0
    assert f"damage: {path}: {note}" in capsys.readouterr().out
    hdr = orjson.loads(payloads[0])
    for key, value, why in [
        ("start_ns", "5", "start_ns: want int, got str"),
        (
            "topology",
            hdr["topology"] | {"cpu_node": {"0": "0"}},
            "topology.cpu_node.0: want int, got str",
        ),
        ("analysis", {"gaps": {"min_gap_ns": 1.5}}, "gaps.min_gap_ns: want int, got float"),
        ("probes", ["sched", 1], "probes[1]: want str, got int"),
    ]:
        path.write_bytes(preamble() + frame(orjson.dumps(hdr | {key: value})))
        assert main(["report", str(path)]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1, err


def test_fuzzed_field_types_in_a_trace_end_in_a_report_or_one_line(tmp_path: Path) -> None:
    payloads = write_trace(tmp_path / "real.gjtrace")
    records = [orjson.loads(p) for p in payloads]
    rng = random.Random(10)
    path = tmp_path / "fuzz.gjtrace"
    failures = []
    for n in range(2000):
        index = 0 if rng.random() < 0.2 else rng.randrange(1, len(records))
        rec, what = mutate(records[index], rng)
        mutated = [*payloads[:index], json.dumps(rec).encode(), *payloads[index + 1 :]]
        path.write_bytes(preamble() + b"".join(frame(p) for p in mutated))
        for command in ("trace", "report") if n % 4 == 0 else ("trace",):
            try:
                rc, err = run_command(command, str(path))
            except Exception as exc:  # each escape is a failure, reported with the others
                failures.append(f"{command} record {index} {what}: {type(exc).__name__}: {exc}")
                continue
            if rc not in (0, 1, 2) or "\n" in err:
                failures.append(f"{command} record {index} {what}: {rc}, {err!r}")
    assert not failures, f"{len(failures)} failures, e.g. " + "\n".join(failures[:20])


def test_fuzzed_field_types_in_an_attribution_log_are_refused_not_shown(tmp_path: Path) -> None:
    log = tmp_path / "attributions.jsonl"
    with JsonLog(log) as w:
        for ev in every_kind():
            if ev.KIND in ("gpu.gap", "gpu.attribution"):
                w.write(ev)
    lines = log.read_bytes().splitlines(keepends=True)
    rng = random.Random(7)
    path = tmp_path / "fuzz.jsonl"
    failures = []
    for _ in range(500):
        index = rng.randrange(len(lines))
        rec, what = mutate(orjson.loads(lines[index]), rng)
        path.write_bytes(
            b"".join([*lines[:index], json.dumps(rec).encode() + b"\n", *lines[index + 1 :]])
        )
        try:
            scene, rest = read_recording(path)
            read = [*scene, *rest]  # a replay reads as it plays
        except GpujitterError as err:
            if "\n" in str(err):
                failures.append(f"line {index + 1} {what}: not one line: {err}")
            continue
        except Exception as exc:
            failures.append(f"line {index + 1} {what}: {type(exc).__name__}: {exc}")
            continue
        model = NodeModel()
        model.apply_all(read)
        if any("malformed" in k for k in model.ignored):
            failures.append(f"line {index + 1} {what}: dropped without a word: {model.ignored}")
    assert not failures, f"{len(failures)} failures, e.g. " + "\n".join(failures[:20])
