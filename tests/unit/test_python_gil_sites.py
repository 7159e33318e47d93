"""Where the python_gil probe puts its hooks: take_gil by its symbol, or in a stripped build
as the one call that PyEval_RestoreThread and PyEval_AcquireThread share; checked against
the symbol in the interpreters of this machine that keep one (pyenv's), and on this venv's
stripped Debian python3.11."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from gpujitter.probes.elf import ElfFile
from gpujitter.probes.python_gil import CALLERS, NO_GIL_PROBE, TAKER, acquire_site, call_targets

PYENV = Path("/root/.pyenv/versions")


def libpython(version: str) -> Path:
    found = sorted(PYENV.glob(f"{version}.*/lib/libpython{version}.so.1.0"))
    if not found:
        pytest.fail(f"no pyenv libpython{version} here")
    return found[-1]


def shared_calls(elf: ElfFile) -> set[int]:
    found = elf.functions(set(CALLERS))
    return set.intersection(*(call_targets(elf, found[c]) for c in CALLERS))


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12"])
def test_the_callers_first_call_is_take_gil_where_its_symbol_says_so(version: str) -> None:
    elf = ElfFile(libpython(version))
    assert shared_calls(elf) == {elf.functions({TAKER})[TAKER]}


def test_callers_that_share_only_a_plt_call_give_no_address() -> None:
    # 3.13's PyEval_RestoreThread and PyEval_AcquireThread both call a PLT stub first: a
    # stripped 3.13 must get no GIL probe, not that stub.
    assert shared_calls(ElfFile(libpython("3.13"))) == set()


def test_a_stripped_interpreter_is_probed_through_its_callers() -> None:
    python = Path(os.path.realpath(sys.executable))
    elf = ElfFile(python)
    if TAKER in elf.functions({TAKER}):
        pytest.fail(f"{python} keeps a {TAKER} symbol")
    site = acquire_site(python)
    assert site.found == "calls" and site.address >= 0
    assert site.address - site.skip in shared_calls(elf)


def test_a_launcher_linked_to_libpython_is_passed_over() -> None:
    launchers = sorted(PYENV.glob("3.12.*/bin/python3.12"))
    if not launchers or acquire_site(launchers[-1]).found == "symbol":
        pytest.fail("no pyenv launcher linked to libpython here")
    site = acquire_site(launchers[-1])
    assert site.launcher and site.address == -1


def test_a_cut_short_file_is_no_gil_probe(tmp_path: Path) -> None:
    cut = tmp_path / "python3.11"
    cut.write_bytes(Path(os.path.realpath(sys.executable)).read_bytes()[:4096])
    site = acquire_site(cut)
    assert site.address == -1 and site.why.startswith(NO_GIL_PROBE)
