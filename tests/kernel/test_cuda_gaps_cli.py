"""`gpujitter gaps` live on this kernel, against the stub libcuda: the command streams each
host pause of a feeding process as a gap (NDJSON), placed where the pause really was, and
says in its stream that NVML is unavailable here."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpujitter.daemon.drill.build import build_stub
from tests.kernel.test_cuda import FEED, MS, SLACK_NS, quiet_spans

GPUJITTER = Path(sys.executable).with_name("gpujitter")


@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_stub(tmp_path_factory.mktemp("stubcuda"))


def test_gaps_streams_each_pause_live(stub: Path) -> None:
    pauses_ms = (30, 70)
    schedule: list[Any] = [["call", "cuLaunchKernel", 1, 1]]
    for pause in pauses_ms:
        schedule += [
            ["call", "cuLaunchKernel", 200, 25],
            ["call", "cuStreamSynchronize", 0, 1],
            ["pause", pause],
        ]
    schedule.append(["call", "cuLaunchKernel", 1, 1])
    feeder = subprocess.Popen(
        [sys.executable, *FEED, str(stub), json.dumps(schedule)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    gaps = subprocess.Popen(
        [str(GPUJITTER), "gaps", "--json", "--pid", str(feeder.pid), "--min-gap", "20ms"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert gaps.stdout is not None and feeder.stdin is not None and feeder.stdout is not None
    try:
        statuses: dict[str, dict[str, Any]] = {}
        while statuses.get("cuda", {}).get("state") != "running":
            line = gaps.stdout.readline()
            assert line, "gpujitter gaps ended before the cuda probe ran"
            rec = json.loads(line)
            assert rec["type"] == "meta.probe", rec
            statuses[rec["probe"]] = rec
        feeder.stdin.write("go\n")
        feeder.stdin.flush()
        truth = json.loads(feeder.stdout.readline())
        assert feeder.wait(timeout=30) == 0
    finally:
        gaps.send_signal(signal.SIGINT)
        out, _ = gaps.communicate(timeout=30)
    assert gaps.returncode == 0
    assert statuses["nvml"]["state"] == "unavailable"
    records = [json.loads(line) for line in out.splitlines()]
    found = [r for r in records if r["type"] == "gpu.gap"]
    pauses = quiet_spans(truth)
    assert len(found) == len(pauses)
    for gap, (t0, t1) in zip(found, pauses, strict=True):
        assert t0 - SLACK_NS <= gap["ts_ns"] <= t0
        assert t1 <= gap["end_ns"] <= t1 + SLACK_NS
        assert gap["sources"] == ["cuda"] and gap["gpu"] == -1  # no NVML: GPU unknown
        assert gap["tgids"] == [feeder.pid] and gap["tid_after"] == feeder.pid
        assert gap["confidence"] == 0.9  # each pause followed a synchronisation
        assert gap["resolution_ns"] < MS
