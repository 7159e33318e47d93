"""System state for memory tests, always restored: a swap file, a memory cgroup (v1) with a
limit, sysctls; and a workload child that waits until the probes watch it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

MEMCG_V1 = Path("/sys/fs/cgroup/memory")
PAGE = os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def sysctl(name: str, value: str) -> Iterator[None]:
    """Set /proc/sys/<name> (dots or slashes) for the block, then put the old value back."""
    path = Path("/proc/sys") / name.replace(".", "/")
    old = path.read_text().strip()
    path.write_text(value)
    try:
        yield
    finally:
        path.write_text(old)


@contextlib.contextmanager
def swap_file(path: Path, size_bytes: int) -> Iterator[Path]:
    """A swap file, on for the block; swapped off and removed afterwards, even on failure."""
    try:
        subprocess.run(["fallocate", "-l", str(size_bytes), str(path)], check=True)
        path.chmod(0o600)
        subprocess.run(["mkswap", str(path)], check=True, capture_output=True)
        subprocess.run(["swapon", str(path)], check=True)
        yield path
    finally:
        if str(path) in Path("/proc/swaps").read_text():
            subprocess.run(["swapoff", str(path)], check=True)
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def memory_cgroup(name: str, limit_bytes: int) -> Iterator[Path]:
    """A cgroup-v1 memory cgroup limited to limit_bytes. On exit its remaining processes
    are moved back to the root cgroup and the directory is removed."""
    group = MEMCG_V1 / name
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                (MEMCG_V1 / "cgroup.procs").write_text(pid)
        for _ in range(50):  # rmdir fails while the kernel still releases the last task
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
        else:
            group.rmdir()


def vmstat(name: str) -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        key, value = line.split()
        if key == name:
            return int(value)
    raise KeyError(name)


# Prepended to every workload: run `body` once the parent writes a line, then print the
# thread's fault counts over the body (getrusage) and what the body returned, as JSON.
_GATED = """
import json, resource, sys
def report(body):
    if not sys.stdin.readline():  # the parent went away before releasing us
        sys.exit(1)
    before = resource.getrusage(resource.RUSAGE_THREAD)
    result = body()
    after = resource.getrusage(resource.RUSAGE_THREAD)
    print(json.dumps({"minflt": after.ru_minflt - before.ru_minflt,
                      "majflt": after.ru_majflt - before.ru_majflt, "result": result}))
"""


@dataclass
class Workload:
    """A child process that runs `script` (which calls report(body)) when released."""

    script: str
    args: list[str] = field(default_factory=list)
    child: subprocess.Popen[str] = field(init=False)
    report: dict[str, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.child = subprocess.Popen(
            [sys.executable, "-c", _GATED + self.script, *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.child.pid

    def release(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.write("go\n")
        self.child.stdin.flush()

    def wait(self) -> None:
        out, _ = self.child.communicate(timeout=120)
        assert self.child.returncode == 0, out
        self.report = json.loads(out)

    def run(self) -> None:
        """Release the child and wait for its report (what run_probes calls as `load`)."""
        self.release()
        self.wait()

    def kill(self) -> None:
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()


@pytest.fixture
def spawn() -> Iterator[Callable[..., Workload]]:
    """Make Workloads; the test's leftovers are killed when it ends, passed or not."""
    made: list[Workload] = []

    def make(script: str, *args: str) -> Workload:
        made.append(Workload(script, list(args)))
        return made[-1]

    yield make
    for w in made:
        w.kill()


def run_all(*workloads: Workload) -> Callable[[], None]:
    """A load that releases the workloads together and waits for all of them."""

    def load() -> None:
        for w in workloads:
            w.release()
        for w in workloads:
            w.wait()

    return load
