"""`gpujitter report`'s options as an operator types them: times as journalctl, Prometheus
and Grafana print them, counts, GPUs that are not in the recording."""

from __future__ import annotations

import gc
import json
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpujitter.cli import main
from gpujitter.daemon.analysis.gaps import UNKNOWN_GPU
from gpujitter.daemon.analysis.records import Attribution, Part
from gpujitter.daemon.sinks.trace import TraceWriter
from gpujitter.probes.clock import wall_ns
from tests.fixtures.streams.synthetic import MS, T0, TWO_NODES, Stream
from tests.unit.trace_samples import header, one_gap_trace


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return one_gap_trace(tmp_path / "one.gjtrace")


def iso_z(path: Path, mono_ns: int) -> str:
    """The wall time of a point of the recording as Prometheus and Grafana print it."""
    clock = header(topology=TWO_NODES).clock
    at = datetime.fromtimestamp(wall_ns(clock, T0 + mono_ns) / 1e9, UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def gaps_listed(out: str) -> int:
    return out.count("GPU0 idle")


def test_from_and_to_take_iso_8601_times_in_utc(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(trace), "--from", iso_z(trace, 99 * MS)]) == 0
    assert gaps_listed(capsys.readouterr().out) == 1
    assert main(["report", str(trace), "--from", iso_z(trace, 101 * MS)]) == 0
    assert gaps_listed(capsys.readouterr().out) == 0
    assert main(["report", str(trace), "--to", iso_z(trace, 101 * MS)]) == 0
    assert gaps_listed(capsys.readouterr().out) == 1


def test_the_recordings_start_is_printed_with_its_zone(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(trace)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.split("recorded from ")[1].split(";")[0][-5:-4] in "+-"  # e.g. +0000


def test_a_negative_top_is_refused(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(trace), "--top", "-3"])
    assert exit_.value.code == 2
    assert "want a whole number, 0 or more" in capsys.readouterr().err


def test_a_gpu_not_in_the_recording_is_said(
    trace: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(trace), "--gpu", "7"]) == 0
    out = capsys.readouterr().out
    assert "GPU7: not in this recording (GPUs with gaps: GPU0)" in out


def test_the_header_line_says_the_override_placed_gpu_minus_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    placed = replace(TWO_NODES, override="split.toml", unknown_gpu_node=0)
    s = Stream(placed).migrate(90, 0, 2).ran(0, 1000, node=1).gap(100, 140, gpu=UNKNOWN_GPU)
    with TraceWriter(tmp_path / "placed.gjtrace", header(topology=placed)) as writer:
        for ev in s.in_emission_order():
            writer.write(ev)
    assert main(["report", str(tmp_path / "placed.gjtrace")]) == 0
    out = capsys.readouterr().out
    assert (
        "topology override in force: split.toml; "
        "GPU -1 (no bus id) placed on node 0 by the override"
    ) in out.splitlines()
    assert main(["report", "--json", str(tmp_path / "placed.gjtrace")]) == 0
    (attr,) = json.loads(capsys.readouterr().out)["attributions"]
    assert attr["gpu"] == UNKNOWN_GPU and attr["gpu_node"] == 0
    assert "remote_oncpu" in {p["cause"] for p in attr["parts"]}


def test_the_text_report_holds_the_longest_gaps_not_every_attribution(
    trace: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A day's recording of a busy node is attributed into hundreds of thousands of gaps:
    the text report keeps their sums and its --top longest, not all of them (it held each
    one: 181 MB for a 170 MB trace, growing with the trace)."""
    alive: list[int] = []

    def attributed(events, topology, config):
        for n in range(2000):
            # durations 1..9 ms, ties among them, all in stream order
            at, dur = T0 + n * 100 * MS, (1 + n % 9) * MS
            yield Attribution(ts_ns=at, end_ns=at + dur, gpu=n % 2, sources=("cuda",),
                              resolution_ns=1_000, confidence=0.9,
                              parts=(Part("host_work", dur - MS), Part("irq", MS)))  # fmt: skip
        gc.collect()
        alive.append(sum(isinstance(o, Attribution) for o in gc.get_objects()))

    monkeypatch.setattr("gpujitter.cli.report.analyse", attributed)
    assert main(["report", str(trace), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert alive[0] <= 4  # the 3 longest, and the one just yielded
    assert "GPU0: 1000 gaps, 5.00s idle" in out and "GPU1: 1000 gaps, 5.00s idle" in out
    longest = [line for line in out.splitlines() if " idle 9.00ms at " in line]
    # the longest three (9 ms: n = 8, 17, 26, ...), earliest first, as a sort of them all
    assert len(longest) == 3 and out.count("idle 9.00ms") == 3
    assert [line.split()[0] for line in longest] == ["GPU0", "GPU1", "GPU0"]
    assert main(["report", str(trace), "--top", "0"]) == 0
    assert "longest 0 gaps:" in capsys.readouterr().out
