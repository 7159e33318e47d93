"""The suite's descriptor guard (tests/descriptors.py), in pytest sessions of their own: a
test that closes pytest's capture file, or points a descriptor opened before it elsewhere,
fails with the descriptor named, and the run goes on to its report; without the guard the
first of these takes pytest down (the crash two CI runs ended with)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).parents[2]

SESSION = """
import os
import sys

import pytest


@pytest.fixture(scope="module")
def pipe_end():
    read, write = os.pipe()
    yield read
    os.close(read)
    os.close(write)


def test_its_own_descriptors_come_and_go():
    read, write = os.pipe()
    os.close(read)
    os.close(write)


def test_closes_the_capture_file():
    os.close(sys.stderr.fileno())


def test_points_a_descriptor_elsewhere(pipe_end):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, pipe_end)
    os.close(null)


def test_after_them():
    pass
"""


def run_session(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_session.py").write_text(SESSION)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *options,
         "--rootdir", str(tmp_path), str(tmp_path / "test_session.py")],
        cwd=CHECKOUT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_guard_fails_the_test_that_closed_a_descriptor_and_the_run_reports(
    tmp_path: Path,
) -> None:
    run = run_session(tmp_path, "-p", "tests.descriptors")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "2 failed, 2 passed" in out, out
    closed = [line for line in out.splitlines() if "open before the test, was closed" in line]
    assert closed and "(deleted)" in closed[0], out  # pytest's capture file, by its name
    assert "open before the test, now points to /dev/null" in out, out
    assert "test_session.py::test_closes_the_capture_file" in out, out
    assert "test_session.py::test_points_a_descriptor_elsewhere" in out, out


def test_without_the_guard_the_same_close_ends_the_run_without_its_report(
    tmp_path: Path,
) -> None:
    run = run_session(tmp_path)
    out = run.stdout + run.stderr
    assert "lost sys.stderr" in out, out
    assert "passed" not in out, out
