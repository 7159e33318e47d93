"""GPU idle floors across restarts: the daemon's state file (kept per board, ignored with one
line when it cannot be trusted) and the trace header that carries the floor in force to
`gpujitter report`, so that a replay decides as the daemon did live. The GPU is the H200 of
the recorded NVML session; the floor is the one its proof run's utilisation proved."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import orjson
import pytest

from gpujitter.cli import main
from gpujitter.daemon.analysis.gaps import GapDetector
from gpujitter.daemon.analysis.pipeline import AnalysisConfig, analyse
from gpujitter.daemon.analysis.records import Attribution
from gpujitter.daemon.service.idle_floors import IdleFloorStore
from gpujitter.daemon.sinks.trace import TraceWriter
from gpujitter.probes.events import CudaCall, Event, from_record
from gpujitter.probes.nvml import GpuInfo, Nvml
from gpujitter.probes.nvml_session import NvmlPlayback
from tests.conftest import FIXTURES
from tests.fixtures.streams.synthetic import detect
from tests.unit.trace_samples import header

PROOF = FIXTURES / "gaps" / "h200-proof-events.ndjson"
TRUTH = FIXTURES / "gaps" / "h200-proof-truth.json"
MS = 1_000_000


@pytest.fixture(scope="module")
def h200() -> GpuInfo:
    (gpu,) = Nvml(NvmlPlayback(FIXTURES / "nvml" / "h200-idle.jsonl")).open().gpus(cpu_count=16)
    return gpu


@pytest.fixture(scope="module")
def restart() -> tuple[list[Event], list[Event]]:
    """The proof run cut 100 ms into its last busy stretch, after the GPU's last idle: what
    a first daemon saw, and what one restarted there sees (no traced calls: power alone)."""
    stream = [from_record(orjson.loads(line)) for line in PROOF.read_bytes().splitlines()]
    at = [t for t in json.loads(TRUTH.read_text()) if t["cmd"] == "busy"][-1]["t0"] + 100 * MS
    before = [e for e in stream if e.ts_ns < at]
    after = [e for e in stream if e.ts_ns >= at and not isinstance(e, CudaCall)]
    return before, after


def learned(before: list[Event]) -> dict[int, float]:
    first = GapDetector()
    detect(before, first)
    return first.idle_floors()


def test_a_floor_kept_by_one_daemon_is_found_by_the_next(
    tmp_path: Path, h200: GpuInfo, restart: tuple[list[Event], list[Event]]
) -> None:
    path = tmp_path / "idle-floors.json"
    floors = learned(restart[0])
    IdleFloorStore(path, [h200]).save(floors)
    assert IdleFloorStore(path, [h200]).load() == (floors, "")
    assert path.stat().st_size < 300 and [p.name for p in tmp_path.iterdir()] == [path.name]
    # Another node's board (a copied disk image) shares nothing with this one.
    other = dataclasses.replace(h200, uuid="GPU-00000000-0000-0000-0000-000000000000")
    assert IdleFloorStore(path, [other]).load() == ({}, "")
    assert IdleFloorStore(tmp_path / "absent.json", [h200]).load() == ({}, "")  # first start


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        '{"format": 99, "boards": {}}',
        '{"format": 1, "boards": {"GPU-x": {"model": "NVIDIA H200", "idle_w": -5}}}',
        '{"format": 1, "boards": {"GPU-x": {"model": "NVIDIA H200", "idle_w": "120"}}}',
    ],
)
def test_a_damaged_state_file_is_ignored_with_one_line(
    tmp_path: Path, h200: GpuInfo, text: str
) -> None:
    path = tmp_path / "idle-floors.json"
    path.write_text(text)
    floors, note = IdleFloorStore(path, [h200]).load()
    assert floors == {}
    assert note.startswith(f"ignoring {path}: ") and "\n" not in note


def test_a_floor_of_another_gpu_model_under_the_same_key_is_not_trusted(
    tmp_path: Path, h200: GpuInfo, restart: tuple[list[Event], list[Event]]
) -> None:
    path = tmp_path / "idle-floors.json"
    IdleFloorStore(path, [dataclasses.replace(h200, name="NVIDIA H100 80GB HBM3")]).save(
        learned(restart[0])
    )
    floors, note = IdleFloorStore(path, [h200]).load()
    assert floors == {}
    assert "NVIDIA H100 80GB HBM3" in note and "NVIDIA H200" in note and "\n" not in note


def report_attributions(trace: Path, capsys: pytest.CaptureFixture[str]) -> list[tuple[int, int]]:
    assert main(["report", "--json", str(trace)]) == 0
    out = json.loads(capsys.readouterr().out)["attributions"]
    return [(a["ts_ns"], a["end_ns"]) for a in out]


def test_report_replays_with_the_floor_the_daemon_started_with(
    tmp_path: Path,
    restart: tuple[list[Event], list[Event]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    floors = learned(restart[0])
    config = AnalysisConfig(idle_floors_w=floors)
    live = [
        (a.ts_ns, a.end_ns)
        for a in analyse(restart[1], header().topology, config)
        if isinstance(a, Attribution)
    ]
    assert len(live) == 5  # the stalls after the restart, found by power alone
    trace = tmp_path / "restarted.gjtrace"
    with TraceWriter(trace, header(analysis=config.to_record())) as w:
        for ev in restart[1]:
            w.write(ev)
    assert report_attributions(trace, capsys) == live
    # A trace recorded before floors were kept (its header has none) replays with today's
    # detector: nothing claimed on power alone.
    old = tmp_path / "old.gjtrace"
    with TraceWriter(old, header(analysis={"gaps": {}, "engine": {}})) as w:
        for ev in restart[1]:
            w.write(ev)
    assert report_attributions(old, capsys) == []


def test_a_state_file_that_is_no_regular_file_is_ignored_not_waited_on(
    tmp_path: Path, h200: GpuInfo
) -> None:
    # A FIFO at the state file's path held the daemon's start for ever (its open waits for a
    # writer), one at the temporary file's its main loop at the first save.
    path = tmp_path / "idle-floors.json"
    os.mkfifo(path)
    assert IdleFloorStore(path, [h200]).load() == ({}, f"ignoring {path}: not a regular file")
    path.unlink()
    path.symlink_to("/dev/zero")
    assert IdleFloorStore(path, [h200]).load() == ({}, f"ignoring {path}: not a regular file")
    path.unlink()
    store = IdleFloorStore(path, [h200])
    os.mkfifo(path.with_name(path.name + ".tmp"))
    with pytest.raises(OSError):
        store.save({h200.index: 80.0})
    assert not path.exists()
