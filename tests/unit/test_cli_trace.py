"""`gpujitter trace` and the checks `gpujitter record` makes before it attaches anything."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from gpujitter.cli import main
from gpujitter.daemon.sinks.trace import TraceWriter
from tests.unit.trace_samples import every_kind, header


def write(path: Path, n_kinds: int = 5) -> bytes:
    with TraceWriter(path, header()) as w:
        for ev in every_kind()[:n_kinds]:
            w.write(ev)
    return path.read_bytes()


def test_trace_shows_header_counts_span_and_damage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = write(tmp_path / "a.gjtrace")
    (tmp_path / "torn.gjtrace").write_bytes(raw[:-5])
    assert main(["trace", str(tmp_path / "a.gjtrace"), str(tmp_path / "torn.gjtrace")]) == 0
    out = capsys.readouterr().out
    assert "host node-7, kernel 6.18.0-test" in out
    assert "probes malloc, sched (thresholds: malloc syscall=100.0us; sched offcpu=1.00ms)" in out
    assert "2 CPUs on 2 node(s), override t" in out
    assert "damage: none" in out
    assert "damage: torn last record dropped (" in out
    assert "total: 2 files, 9 events" in out

    assert main(["trace", "--json", str(tmp_path / "a.gjtrace")]) == 0
    doc = json.loads(capsys.readouterr().out)
    (f,) = doc["files"]
    kinds = sorted(ev.KIND for ev in every_kind()[:5])
    assert f["kinds"] == dict.fromkeys(kinds, 1) and doc["events"] == 5
    assert f["header"] == json.loads(json.dumps(header().to_record()))
    assert f["first_ns"] == min(ev.ts_ns for ev in every_kind()[:5])
    assert (f["damage"], f["readable"], f["format"]) == ([], True, "1.1")


def test_trace_says_the_override_placed_gpu_minus_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    placed = dataclasses.replace(header().topology, unknown_gpu_node=1)
    with TraceWriter(tmp_path / "a.gjtrace", header(topology=placed)):
        pass
    assert main(["trace", str(tmp_path / "a.gjtrace")]) == 0
    out = capsys.readouterr().out
    assert "2 CPUs on 2 node(s), override t; GPU -1 (no bus id) placed on node 1 by the" in out


def test_trace_reports_corruption_with_exit_1_and_refuses_foreign_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = bytearray(write(tmp_path / "a.gjtrace"))
    raw[-200] ^= 0x10  # inside an event that is not the last
    (tmp_path / "a.gjtrace").write_bytes(raw)
    assert main(["trace", "--json", str(tmp_path / "a.gjtrace")]) == 1
    (f,) = json.loads(capsys.readouterr().out)["files"]
    assert not f["readable"] and "checksum mismatch" in f["damage"][0]

    (tmp_path / "x.txt").write_text("hello")
    assert main(["trace", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a gpujitter recording" in err


def test_a_file_left_out_of_a_directory_is_named_on_its_own_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The line break between its name and its damage was escaped with the rest ("\\x0a").
    write(tmp_path / "a.gjtrace")
    (tmp_path / "b\x1b[2J.gjtrace").write_text("hello")
    assert main(["trace", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"\n{tmp_path}/b\\x1b[2J.gjtrace\n  damage: " in out and "\\x0a" not in out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--keep-files", "3"], "need --rotate-size or --rotate-age"),
        (["--rotate-size", "10Q"], "bad size"),
        (["--rotate-size", "1M", "--keep-size", "100k"], "at least the file size"),
        (["--rotate-age", "soon"], "bad duration"),
        (["--rotate-age", ""], "bad duration"),  # not taken as no rotation
        (["--window", "10s"], "--window is how long --precise stays attached"),  # was ignored
        (["--rotate-size", ""], "bad size"),
        (["--rotate-size", "1M", "--keep-size", ""], "bad size"),
        (["--keep-size", ""], "need --rotate-size or --rotate-age"),
        (["nosuchprobe"], "unknown probe"),
        (["-t", "malloc.nope=1ms"], "has no threshold"),
    ],
)
def test_record_refuses_bad_options_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["record", "-o", str(tmp_path / "t.gjtrace"), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_record_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "t.gjtrace").write_text("precious")
    assert main(["record", "-o", str(tmp_path / "t.gjtrace")]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["record", "-o", str(tmp_path / "t.gjtrace"), "--rotate-size", "1M"]) == 2
    assert "this is a file" in capsys.readouterr().err
    assert (tmp_path / "t.gjtrace").read_text() == "precious"


def test_trace_names_analysis_settings_that_report_would_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A header whose analysis block report and export refuse is damage `trace` shows, not
    a clean trace."""
    bad = header(analysis={"gaps": {"min_gap_ns": -1}})
    with TraceWriter(tmp_path / "a.gjtrace", bad) as w:
        w.write(every_kind()[0])
    main(["trace", "--json", str(tmp_path / "a.gjtrace")])
    (f,) = json.loads(capsys.readouterr().out)["files"]
    assert any("min_gap_ns must not be negative" in d for d in f["damage"])
    assert main(["report", str(tmp_path / "a.gjtrace")]) == 2
    assert "min_gap_ns must not be negative" in capsys.readouterr().err
