"""What a compile's output capture (probes/base.py captured_output) takes: the C code's writes
to fds 1 and 2 (bcc's notes, clang's errors), never what Python code of another thread says
meanwhile (a daemon's note, an error printed while the probes compile on their own thread)."""

from __future__ import annotations

import subprocess
import sys

# A fresh process, so that its fds 1 and 2 are the pipes read here (pytest captures them
# otherwise). One thread holds the capture and writes as C code does (to the fd); the main
# thread prints through Python while it lasts, and again after.
SCRIPT = """
import os, sys, threading
from gpujitter.probes.base import captured_output

inside, said = threading.Event(), threading.Event()
taken = []

def compile_like():
    with captured_output() as err:
        os.write(2, b"clang: error: from C\\n")
        os.write(1, b"a note from C\\n")
        inside.set()
        said.wait(10)
        taken.append(err())

stderr_before = sys.stderr  # as a writer thread made before the capture holds it
thread = threading.Thread(target=compile_like)
thread.start()
inside.wait(10)
print("python on stdout during")
print("python on stderr during", file=sys.stderr)
held = sys.stderr  # as a writer thread made during the capture holds it
said.set()
thread.join()
print("python on stderr after, through the stream taken during", file=held, flush=True)
print("python on stdout after")
assert sys.stderr is stderr_before
print("captured:", repr(taken[0]))
"""


def test_python_output_of_other_threads_is_not_captured() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "python on stderr during",
        "python on stderr after, through the stream taken during",
    ]
    lines = out.stdout.splitlines()
    assert lines[:2] == ["python on stdout during", "python on stdout after"]
    # The C code's output, and only it, was taken.
    assert lines[2] == "captured: 'clang: error: from C\\na note from C\\n'"
