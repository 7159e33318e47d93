"""`gpujitter export`: a recording as a Chrome trace-event timeline, checked for the structure
Perfetto and chrome://tracing need and for what it must show (a gap with its causes, the
thread's run-queue wait behind the task that ran instead)."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from gpujitter.cli import main
from gpujitter.daemon.timeline import GPU_PID
from tests.fixtures.streams.synthetic import MS, T0
from tests.unit.trace_samples import one_gap_trace

PHASES = {"X", "C", "M"}


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
