"""Build the drills' C parts with gcc at run time: the stub libcuda (stubcuda.c, as
libcuda.so.1) and the injection helpers (inject.c). `cached_*` keep each build in a cache
folder keyed by its source and flags, so a drill compiles once per version; `build_stub`
checks that the stub looks to the uprobe path like the real libcuda: every traced entry
point exported, each a function of its own starting with push %rbp (no endbr64)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from gpujitter.errors import GpujitterError
from gpujitter.probes.cuda import FUNC_NAMES
from gpujitter.probes.elf import ElfFile

HERE = Path(__file__).parent
STUB_SOURCE = HERE / "stubcuda.c"
INJECT_SOURCE = HERE / "inject.c"
PUSH_RBP = 0x55

# -O0 for the stub: every function opens with push %rbp; mov %rsp,%rbp, as libcuda's do
# (optimised builds may schedule other instructions first).
STUB_FLAGS = ("-O0", "-fcf-protection=none", "-Wall", "-Werror", "-lpthread")
INJECT_FLAGS = ("-O2", "-Wall", "-Werror")


def cache_dir() -> Path:
    """$GPUJITTER_CACHE, else $XDG_CACHE_HOME/gpujitter, else ~/.cache/gpujitter."""
    explicit = os.environ.get("GPUJITTER_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpujitter"


def _gcc(source: Path, out: Path, flags: tuple[str, ...]) -> Path:
    if shutil.which("gcc") is None:
        raise GpujitterError("the drills build their C parts with gcc, which is not installed")
    cmd = ["gcc", "-shared", "-fPIC", *[f for f in flags if not f.startswith("-l")]]
    cmd += ["-o", str(out), str(source), *[f for f in flags if f.startswith("-l")]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        raise GpujitterError(f"gcc could not build {source.name}: {first}")
    return out


def build_stub(folder: Path, exports: tuple[str, ...] = ()) -> Path:
    """The stub libcuda; with `exports`, only those functions are exported (a version
    script hides the rest)."""
    flags: tuple[str, ...] = STUB_FLAGS
    if exports:
        script = folder / "exports.map"
        script.write_text("{ global: " + "".join(f"{n}; " for n in exports) + "local: *; };\n")
        flags = (*flags, f"-Wl,--version-script={script}")
    out = _gcc(STUB_SOURCE, folder / "libcuda.so.1", flags)
    traced = [name for name in FUNC_NAMES if not exports or name in exports]
    with ElfFile(out) as elf:
        functions = elf.exported_functions()
        missing = [name for name in traced if name not in functions]
        if missing:
            raise GpujitterError(f"stub libcuda lacks {missing}")
        addresses = [functions[name] for name in traced]
        if len(set(addresses)) != len(addresses):
            raise GpujitterError("stub libcuda folds entry points together")
        for name in traced:
            if elf.code(functions[name], 1) != bytes([PUSH_RBP]):
                raise GpujitterError(f"stub {name} does not start with push %rbp")
    return out


def build_inject(folder: Path) -> Path:
    return _gcc(INJECT_SOURCE, folder / "libgjinject.so", INJECT_FLAGS)


def _cached(build: Callable[[Path], Path], source: Path, flags: tuple[str, ...]) -> Path:
    """The build's output under cache_dir()/drill/<key>/, built there once (in a temporary
    folder renamed into place, so that concurrent drills never see half a library)."""
    key = hashlib.sha256(source.read_bytes() + "\0".join(flags).encode()).hexdigest()[:16]
    root = cache_dir() / "drill"
    folder = root / f"{source.stem}-{key}"
    if folder.is_dir():
        return next(folder.glob("*.so*"))
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=root, prefix=".build-"))
    try:
        out = build(work)
        with contextlib.suppress(OSError):  # another drill got there first: use its build
            work.rename(folder)
        return folder / out.name
    finally:
        shutil.rmtree(work, ignore_errors=True)


# What the drills' feeding loop calls. Their stub exports nothing else: the cuda probe puts
# a uprobe on every traced function a libcuda exports, and on this kernel each one takes
# ~130 ms to detach (6.6 s for the 51 of a full libcuda), which would dominate short drills.
DRILL_EXPORTS = ("cuInit", "cuLaunchKernel", "cuStreamSynchronize", "stubDrainsAtNs")


def cached_stub() -> Path:
    """The drills' stub libcuda (DRILL_EXPORTS only)."""
    return _cached(
        lambda folder: build_stub(folder, DRILL_EXPORTS), STUB_SOURCE, (*STUB_FLAGS, *DRILL_EXPORTS)
    )


def cached_inject() -> Path:
    return _cached(build_inject, INJECT_SOURCE, INJECT_FLAGS)


if __name__ == "__main__":
    # python -m gpujitter.daemon.drill.build [CACHE]: build the drills' C parts into a cache
    # folder (for a node without gcc: carry it there and point GPUJITTER_CACHE at it).
    import sys

    if len(sys.argv) > 1:
        os.environ["GPUJITTER_CACHE"] = sys.argv[1]
    print(cached_inject(), cached_stub())
