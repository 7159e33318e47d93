"""A child process that writes to a sink until it is killed or its writes fail, for the crash
and disk-full tests of both sinks (a real process dying, a real EFBIG from the kernel)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

_TEMPLATE = """
import resource, signal, sys
from gpujitter.errors import GpujitterError
{imports}
limit, path = int(sys.argv[1]), sys.argv[2]
if limit:  # the file may not grow past `limit` bytes: writes fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
sink = {open_sink}
i = 0
try:
    while True:
        {write}
        i += 1
        if i == {ready}:
            print("ready", flush=True)
except GpujitterError as err:
    print(i, err, flush=True)
"""


def sink_writer(
    path: Path, *, imports: str, open_sink: str, write: str, ready: int, fsize_limit: int = 0
) -> subprocess.Popen[str]:
    """Start the child: it prints "ready" after `ready` writes, and "COUNT ERROR" when a write
    fails. `write` is one statement writing record number `i` to `sink`."""
    code = _TEMPLATE.format(
        imports=textwrap.dedent(imports), open_sink=open_sink, write=write, ready=ready
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, str(fsize_limit), str(path)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )


def kill_when_ready(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the child once it said "ready": a crash at an arbitrary point of its writes."""
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
