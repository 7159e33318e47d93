"""Where the python_gc probe puts its hooks: stapsdt argument specs read into register
locations, interpreter files told apart in a process's maps, and a file without markers or
collector symbol reported as having no GC probe (never an error)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpujitter.probes.python_gc import (
    INTERPRETER,
    MAX_INTERPRETERS,
    NO_GC_PROBE,
    REG_NONE,
    REGISTERS,
    SLOT_PROGRAMS,
    MarkerArg,
    interpreter_hooks,
    parse_arg,
)


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("-4@112(%rsp)", MarkerArg(4, True, REGISTERS.index("sp"), True, 112)),
        ("-8@%r12", MarkerArg(8, True, REGISTERS.index("r12"), False, 0)),
        ("4@%r12d", MarkerArg(4, False, REGISTERS.index("r12"), False, 0)),
        ("-4@%eax", MarkerArg(4, True, REGISTERS.index("ax"), False, 0)),
        ("8@-0x18(%rbp)", MarkerArg(8, False, REGISTERS.index("bp"), True, -0x18)),
        ("-4@$2", MarkerArg(4, True, REG_NONE, False, 2)),
        ("1@%dil", MarkerArg(1, False, REGISTERS.index("di"), False, 0)),
    ],
)
def test_stapsdt_argument_specs(spec: str, want: MarkerArg) -> None:
    assert parse_arg(spec) == want


@pytest.mark.parametrize("spec", ["8@(%rax,%rbx,8)", "-4@%fs:8", "8@sym", "3@%rax", ""])
def test_forms_it_cannot_read_give_no_location(spec: str) -> None:
    assert parse_arg(spec) is None


@pytest.mark.parametrize(
    ("name", "interpreter"),
    [("python3.11", True), ("python3", True), ("python3.12d", True),
     ("libpython3.11.so.1.0", True), ("libpython3.12.so", True),
     ("python3.11-config", False), ("libc.so.6", False), ("pythonista", False)],
)  # fmt: skip
def test_interpreter_files_by_name(name: str, interpreter: bool) -> None:
    assert bool(INTERPRETER.match(name)) is interpreter


def test_a_program_without_a_collector_is_a_launcher_not_an_interpreter() -> None:
    # python3.X linked against libpython holds no collector (the library does): it is not
    # reported as an interpreter without a GC probe.
    assert interpreter_hooks("/bin/true").via == "launcher"


def test_a_file_that_is_not_elf_has_no_gc_probe(tmp_path: Path) -> None:
    path = tmp_path / "python3.11"
    path.write_text("#!/bin/sh\n")
    assert interpreter_hooks(path).via == "none"


DEBIAN_PYTHON = Path("/usr/bin/python3.11")


def test_debian_python_has_both_markers_with_semaphores() -> None:
    assert DEBIAN_PYTHON.exists(), "Debian's python3.11 is not here (the set-up installs it)"
    hooks = interpreter_hooks(DEBIAN_PYTHON)
    assert hooks.via == "usdt"
    assert hooks.start is not None and hooks.done is not None
    assert hooks.start.semaphore and hooks.done.semaphore
    assert hooks.start.arg is not None and hooks.done.arg is not None
    # Without a kernel that raises semaphores, the guarded markers are of no use.
    assert interpreter_hooks(DEBIAN_PYTHON, ref_ctr=False).via == "none"


def test_an_interpreter_built_without_markers_and_stripped_has_no_gc_probe(
    tmp_path: Path,
) -> None:
    assert DEBIAN_PYTHON.exists() and shutil.which("objcopy"), "needs python3.11, objcopy"
    # What python.org-style builds are: the collector is there (PyGC_Collect exported), but
    # no marker and no gc_collect_main symbol to probe it by.
    bare = tmp_path / "python3.11"
    subprocess.run(
        ["objcopy", "--remove-section", ".note.stapsdt", str(DEBIAN_PYTHON), str(bare)],
        check=True,
    )
    hooks = interpreter_hooks(bare)
    assert hooks.via == "none" and hooks.why.startswith(NO_GC_PROBE)


def test_a_truncated_interpreter_file_has_no_gc_probe_and_raises_nothing(tmp_path: Path) -> None:
    assert DEBIAN_PYTHON.exists(), "Debian's python3.11 is not here (the set-up installs it)"
    # A file being replaced under a running process (an upgrade) can be cut short: its
    # header claims sections past its end.
    cut = tmp_path / "python3.11"
    cut.write_bytes(DEBIAN_PYTHON.read_bytes()[:4096])
    hooks = interpreter_hooks(cut)
    assert hooks.via == "none" and hooks.why.startswith(NO_GC_PROBE)


def test_the_collector_symbol_of_a_non_pie_executable_is_given_by_its_address(
    tmp_path: Path,
) -> None:
    assert shutil.which("gcc") and shutil.which("nm"), "needs gcc and nm (the set-up installs them)"
    # bcc's attach_uprobe(addr=) takes the ELF's virtual address and finds the file offset
    # itself; in an ET_EXEC executable (a statically linked python3.X) the two differ, so a
    # file offset there puts the uprobe on some other instruction.
    source = tmp_path / "python3.11.c"
    source.write_text(
        "__attribute__((noinline)) long gc_collect_main(long g) { return g + 1; }\n"
        "int main(int argc, char **argv) { (void)argv; return (int)gc_collect_main(argc); }\n"
    )
    binary = tmp_path / "python3.11"
    subprocess.run(["gcc", "-O1", "-no-pie", "-o", str(binary), str(source)], check=True)
    listed = subprocess.run(["nm", str(binary)], check=True, capture_output=True, text=True)
    address = next(int(line.split()[0], 16) for line in listed.stdout.splitlines()
                   if line.endswith(" gc_collect_main"))  # fmt: skip
    hooks = interpreter_hooks(binary)
    assert hooks.via == "symbol" and hooks.symbol_address == address


def test_the_per_slot_programs_are_as_many_as_the_loader_uses() -> None:
    """Without uprobe-multi links the loader attaches gc_start_N/gc_done_N for N below
    SLOT_PROGRAMS: the .bpf.c must define exactly those (a missing copy is a load error at
    the Nth interpreter, an extra one a compile cost for nothing)."""
    source = (Path(__file__).parents[2] / "probes" / "python_gc.bpf.c").read_text()
    per_slot = source.split("#ifdef GJ_PER_SLOT", 1)[1].split("#else", 1)[0]
    slots = sorted(int(n) for n in re.findall(r"\bGJ_INTERP\((\d+)\)", per_slot))
    assert slots == list(range(SLOT_PROGRAMS)) and SLOT_PROGRAMS <= MAX_INTERPRETERS
