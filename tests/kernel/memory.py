"""System state for memory tests, always restored (a swap file, a memory cgroup (v1) with a
limit, sysctls: the drills' own helpers, daemon/drill/system.py); and a workload child that
waits until the probes watch it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpujitter.daemon.drill.system import MEMCG_V1, PAGE, memory_cgroup, swap_file, sysctl

__all__ = ["MEMCG_V1", "PAGE", "memory_cgroup", "swap_file", "sysctl"]


def vmstat(name: str) -> int:
    for line in Path("/proc/vmstat").read_text().splitlines():
        key, value = line.split()
        if key == name:
            return int(value)
    raise KeyError(name)


# Prepended to every workload: run `body` once the parent writes a line, then print the
# thread's fault counts over the body (getrusage), how long it took (wall and CPU time) and
# what it returned, as JSON; and the process's major faults over its life so far (its
# interpreter's own pages, read back from disk where the page cache had let them go). The
# CPU time is the thread's clock, not getrusage's: its user and system times are ticks
# scaled to the runtime and never moved back, so the difference of two readings around a
# body of a few ms are ticks' worth, not its time (2,000 faults of a kernel-writes body,
# 3.8-4.0 ms of them timed, read 0, 1.5, 2.3 and 2.8 ms beside two spinners).
_GATED = """
import json, resource, sys, time
def report(body):
    if not sys.stdin.readline():  # the parent went away before releasing us
        sys.exit(1)
    before = resource.getrusage(resource.RUSAGE_THREAD)
    t0, cpu0 = time.monotonic_ns(), time.thread_time_ns()
    result = body()
    cpu_ns, body_ns = time.thread_time_ns() - cpu0, time.monotonic_ns() - t0
    after = resource.getrusage(resource.RUSAGE_THREAD)
    print(json.dumps({"minflt": after.ru_minflt - before.ru_minflt, "body_ns": body_ns,
                      "cpu_ns": cpu_ns,
                      "majflt": after.ru_majflt - before.ru_majflt, "result": result,
                      "majflt_life": resource.getrusage(resource.RUSAGE_SELF).ru_majflt}))
"""

# Major faults a workload may take after its report (the interpreter's exit), which its
# majflt_life leaves out
_EXIT_MAJFLT = 8


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

    def major_faults_at_most(self) -> int:
        """The most major faults the process can have taken in its life (once it reported):
        its own count, and its exit's."""
        return int(self.report["majflt_life"]) + _EXIT_MAJFLT

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
