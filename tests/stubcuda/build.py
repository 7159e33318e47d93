"""Build the stub libcuda (stubcuda.c) with gcc into a folder as libcuda.so.1, and check
that it looks to the uprobe path like the real one: every traced entry point exported, each a
function of its own starting with push %rbp (no endbr64)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpujitter.probes.cuda import FUNC_NAMES, read_elf

SOURCE = Path(__file__).with_name("stubcuda.c")
PUSH_RBP = 0x55


def build(folder: Path) -> Path:
    out = folder / "libcuda.so.1"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            # -O0: every function opens with push %rbp; mov %rsp,%rbp, as libcuda's do
            # (optimised builds may schedule other instructions first).
            "-O0",
            "-fcf-protection=none",
            "-Wall",
            "-Werror",
            "-o",
            str(out),
            str(SOURCE),
            "-lpthread",
        ],
        check=True,
    )
    image = read_elf(out)
    missing = [name for name in FUNC_NAMES if name not in image.functions]
    if missing:
        raise RuntimeError(f"stub libcuda lacks {missing}")
    addresses = [image.functions[name] for name in FUNC_NAMES]
    if len(set(addresses)) != len(addresses):
        raise RuntimeError("stub libcuda folds entry points together")
    data = out.read_bytes()
    for name in FUNC_NAMES:
        offset = image.file_offset(image.functions[name])
        if offset is None or data[offset] != PUSH_RBP:
            raise RuntimeError(f"stub {name} does not start with push %rbp")
    return out
