"""A start under a memory cgroup limit it cannot fit (a start peaks at ~180 MiB: the probes'
compile): `gpujitter run` says so, with the fix, as its compile starts (before the peak); one
of 60 MB once thrashed past its --duration with nothing said."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.kernel.memory import memory_cgroup

GPUJITTER = Path(sys.executable).with_name("gpujitter")


def run_under(limit_bytes: int, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`gpujitter run` with one probe for a second, in a memory cgroup of limit_bytes."""
    (tmp_path / "empty.toml").touch()  # no /etc/gpujitter/gpujitter.toml of this node
    with memory_cgroup(f"gpujitter-test-{os.getpid()}", limit_bytes) as group:
        run = subprocess.run(
            [str(GPUJITTER), "run", "--no-nvml", "--probes", "sched", "--duration", "1",
             "--log", "", "--socket", "", "--config", str(tmp_path / "empty.toml")],
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert run.returncode == 0, run.stderr
    return run


def test_run_says_a_tight_memory_limit_before_it_compiles(tmp_path: Path) -> None:
    # Room for one probe's compile, under what the whole set's start wants.
    run = run_under(240 << 20, tmp_path)
    notes = [line for line in run.stderr.splitlines() if line.startswith("# ")]
    said = [i for i, line in enumerate(notes) if line.startswith("# memory: ")]
    attached = [i for i, line in enumerate(notes) if line.startswith("# probes attached")]
    assert said and attached and said[0] < attached[0], run.stderr
    line = notes[said[0]]
    assert " 240 MiB (" in line and "a start peaks at ~180 MiB" in line, line
    assert "MemoryMax=1G" in line, line


def test_run_under_room_enough_says_nothing_of_memory(tmp_path: Path) -> None:
    run = run_under(1 << 30, tmp_path)
    assert "# probes attached" in run.stderr
    assert "# memory: " not in run.stderr, run.stderr
