"""Opening an NVML session where pynvml has no .pyc: its import compiles ~290 KB of source,
and the memory that compile freed must not stay resident into the daemon's start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Prints how much resident memory (MB) `{}` added, in a fresh interpreter whose modules
# have no .pyc (an empty pycache prefix, none written).
_GROWTH = """
import gpujitter.probes.nvml as nvml


def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024


before = rss_mb()
{}
print(rss_mb() - before)
"""


def _growth(statement: str, pycache: Path) -> float:
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(pycache), "PYTHONDONTWRITEBYTECODE": "1"}
    # Whether glibc gives back what the compile freed on its own (the heap's top past the
    # trim threshold, a large block mapped apart) follows the heap's layout, which any
    # change of the paths or the code moves: the clean clone's CI read 5.2 MB where the
    # checkout read 14 for one tree. Held off here, the premise is the worst case's.
    env |= {"MALLOC_TRIM_THRESHOLD_": str(1 << 30), "MALLOC_MMAP_THRESHOLD_": str(1 << 30)}
    # Run from the empty folder: from a checkout's root, `-c` put the root first on the path
    # and the import added 5.1 MB where the clean clone's CI read 14.7.
    out = subprocess.run([sys.executable, "-c", _GROWTH.format(statement)], env=env,
                         cwd=pycache, capture_output=True, text=True, check=True)  # fmt: skip
    return float(out.stdout)


def test_a_session_hands_back_what_compiling_pynvml_freed(tmp_path: Path) -> None:
    plain = _growth("import pynvml", tmp_path)
    session = _growth("nvml.Nvml()", tmp_path)  # imports pynvml; no nvmlInit
    # The premise: compiled from source, the import leaves its compiler's garbage resident.
    assert plain >= 8, f"importing pynvml from source added only {plain:.1f} MB"
    assert session <= plain - 6, f"a session kept {session:.1f} MB of {plain:.1f}"
