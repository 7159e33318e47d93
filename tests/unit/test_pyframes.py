"""The Python frame reader against live interpreters: the system python3.11, and every other
CPython of this machine it claims to read (pyenv's); its layout table against the headers of
each version found (offsetof, compiled here)."""

from __future__ import annotations

import dataclasses
import glob
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujitter.probes.pyframes import (
    DEBUG_FIELDS_313,
    DEBUG_SIZE_313,
    LAYOUTS,
    Interpreter,
    NotReadable,
    layout_from_debug_offsets,
    version_of,
)
from gpujitter.text import decode_name

OFFSETS_C = Path(__file__).parents[1] / "fixtures" / "pyframes" / "offsets.c"
SYSTEM = "/usr/bin/python3.11"
PYENV = sorted(glob.glob("/root/.pyenv/versions/3.1[0-9]*/bin/python3.1[0-9]"))
INTERPRETERS = [p for p in (SYSTEM, *PYENV) if Path(p).exists()]

TARGET = textwrap.dedent(
    """\
    import sys, threading, time

    def parked():
        time.sleep(100)

    def busy_spin(n):
        print(threading.get_native_id(), t.native_id, flush=True)
        x = 0
        while True:
            for i in range(n):
                x += i

    t = threading.Thread(target=parked, daemon=True)
    t.start()
    busy_spin(1000)
    """
)
# The ids are printed from inside busy_spin: printed before the call, a reader could meet the
# main thread still returning from print() at module level (the depth-1 walk then read
# "<module>" under load). print() is a C call, which pushes no Python frame.


@pytest.fixture
def target(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    path = tmp_path / "target.py"
    path.write_text(TARGET)
    yield "target.py", path


def _run(exe: str, path: Path) -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen([exe, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    main, parked = (int(x) for x in proc.stdout.readline().split())
    return proc, main, parked


@pytest.mark.parametrize("exe", INTERPRETERS)
def test_reads_each_threads_innermost_function_with_file_and_line(
    exe: str, target: tuple[str, Path]
) -> None:
    _, path = target
    proc, main, parked = _run(exe, path)
    try:
        interp = Interpreter(proc.pid)
        threads = interp.threads()
        assert set(threads) == {main, parked}
        spin = interp.stack(threads[main], 2)
        sleep = interp.stack(threads[parked], 8)
    finally:
        proc.kill()
        proc.wait()
    assert interp.version == "{}.{}".format(*version_of(Path(exe).name) or ())
    assert [(f.func, f.file, f.line) for f in spin] == [
        ("busy_spin", str(path), 6),
        ("<module>", str(path), 1),
    ]
    assert (sleep[0].func, sleep[0].line) == ("parked", 3)
    assert sleep[-1].func.endswith("_bootstrap")  # the walk reached the thread's entry


def test_depth_bounds_the_walk(target: tuple[str, Path]) -> None:
    proc, main, _ = _run(SYSTEM, target[1])
    try:
        interp = Interpreter(proc.pid)
        assert [f.func for f in interp.stack(interp.threads()[main], 1)] == ["busy_spin"]
    finally:
        proc.kill()
        proc.wait()


def test_a_file_name_of_bytes_that_are_not_utf8_is_kept_as_those_bytes(tmp_path: Path) -> None:
    """os.fsdecode keeps byte 0xff of a file name as a surrogate; the reader writes it as
    every name of the daemon's is written (`\\xff`), so that two such files stay two."""
    path = Path(os.fsdecode(bytes(tmp_path) + b"/t\xffarget.py"))
    path.write_text(TARGET)
    proc, main, _ = _run(SYSTEM, path)
    try:
        interp = Interpreter(proc.pid)
        (frame,) = interp.stack(interp.threads()[main], 1)
    finally:
        proc.kill()
        proc.wait()
    assert frame.file == decode_name(bytes(path)) and frame.file.endswith("/t\\xffarget.py")


def test_another_version_is_refused_in_one_line(target: tuple[str, Path]) -> None:
    old = sorted(glob.glob("/root/.pyenv/versions/3.9*/bin/python3.9"))
    if not old:
        pytest.fail("no CPython 3.9 on this machine (the set-up provides one)")
    proc, _, _ = _run(old[0], target[1])
    try:
        with pytest.raises(NotReadable, match=r"^CPython \(3, 9\): no frame layout"):
            Interpreter(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_process_without_python_is_refused() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(NotReadable, match="no CPython runtime"):
            Interpreter(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def _headers() -> dict[tuple[int, int], Path]:
    found: dict[tuple[int, int], Path] = {}
    pyenv = glob.glob("/root/.pyenv/versions/3.1*/include/python3.1*")
    for inc in [Path("/usr/include/python3.11"), *map(Path, pyenv)]:
        version = version_of(inc.name)
        if version and (inc / "internal" / "pycore_runtime.h").exists():
            found.setdefault(version, inc)
    return found


def _offsets(inc: Path, tmp_path: Path) -> dict[str, int]:
    exe = tmp_path / f"offsets-{inc.name}"
    subprocess.run(["gcc", f"-I{inc}", "-o", str(exe), str(OFFSETS_C)], check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {name: int(value) for name, value in (line.split() for line in out.splitlines())}


@pytest.mark.parametrize("version", sorted(_headers()))
def test_layout_matches_the_headers(version: tuple[int, int], tmp_path: Path) -> None:
    got = _offsets(_headers()[version], tmp_path)
    if version in LAYOUTS:
        table = dataclasses.asdict(LAYOUTS[version])
        assert {k: table[k] for k in got} == got
    else:  # 3.13: where the runtime's debug offsets keep each offset
        debug = {k.removeprefix("debug."): v for k, v in got.items() if k.startswith("debug.")}
        assert debug == DEBUG_FIELDS_313
        assert got["debug_size"] == DEBUG_SIZE_313


def test_debug_offsets_of_another_version_are_refused() -> None:
    raw = bytearray(DEBUG_SIZE_313)
    raw[:8] = b"xdebugpy"
    raw[8:16] = (0x030E00F0).to_bytes(8, "little")  # 3.14.0
    with pytest.raises(NotReadable, match=r"CPython 3\.14"):
        layout_from_debug_offsets(bytes(raw))
    with pytest.raises(NotReadable, match="no _Py_DebugOffsets"):
        layout_from_debug_offsets(bytes(DEBUG_SIZE_313))


def test_versions_from_file_names() -> None:
    assert version_of("python3.11") == (3, 11)
    assert version_of("libpython3.12.so.1.0") == (3, 12)
    assert version_of("python3") is None
    assert version_of(Path(sys.executable).name) in (None, sys.version_info[:2])
