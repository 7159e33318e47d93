"""Reading a library's exported functions costs memory for what is read, not for the file:
a real libcuda is ~100 MB, and reading it whole lifted the daemon's peak on the GPU node to
~300 MB (docs/performance.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# A child's own peak, before and after: the test process's would hide it.
PEAK = """
import resource, sys
from gpujitter.probes.elf import ElfFile
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
with ElfFile(sys.argv[1]) as elf:
    functions = elf.exported_functions()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(len(functions), (after - before) // 1024)
"""


def test_a_large_library_is_not_read_whole(tmp_path: Path) -> None:
    big = tmp_path / "libbig.so"
    shutil.copy(os.path.realpath(sys.executable), big)  # an ELF with exported functions
    os.truncate(big, big.stat().st_size + (256 << 20))  # 256 MB more, holes: nothing on disk
    out = subprocess.run([sys.executable, "-c", PEAK, str(big)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    functions, grew_mb = (int(x) for x in out.stdout.split())
    assert functions > 100
    assert grew_mb < 64
