"""python_gc probe on this kernel, for real: a Python process runs full collections over a
large heap, timed from inside by gc.callbacks, and many short young ones; the probe must
report each full collection with its generation and duration, count the short ones in its
histogram, and ignore a process it does not watch. Interpreters: this venv's python
(Debian's python3.11 through a symlink: USDT markers whose semaphores the probe must raise
by itself) and, where installed, a pyenv build (no markers; its libpython keeps the
gc_collect_main symbol: the uprobe fallback)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpujitter.probes.events import GcPause, Log2Hist, ProbeStatus
from gpujitter.probes.python_gc import interpreter_hooks
from gpujitter.probes.watch import WatchSpec
from tests.kernel.conftest import Recorded, run_probes

MS = 1_000_000
PYENV = Path("/root/.pyenv/versions/3.11.7/bin/python3.11")
INTERPRETERS = {"usdt": Path(sys.executable), "symbol": PYENV}

# The child: a heap of long-lived containers (a full collection traverses all of it), then on
# "go" FULL explicit full collections and young ones from cyclic garbage; it prints what
# gc.callbacks timed (CLOCK_MONOTONIC ns) for every collection, with its generation and the
# objects it found unreachable (what the done marker and the collector's return give).
CHILD = """
import gc, json, sys, time
heap = [[{} for _ in range(10)] for _ in range(40_000)]
seen = []
def timer(phase, info):
    if phase == "start":
        timer.t0 = time.monotonic_ns()
    else:
        seen.append((timer.t0, time.monotonic_ns(), info["generation"],
                     info["collected"] + info["uncollectable"]))
gc.callbacks.append(timer)
print("ready", flush=True)
sys.stdin.readline()
for _ in range(FULL):
    for _ in range(20_000):
        a = []; a.append(a)
    gc.collect()
    time.sleep(0.05)
print(json.dumps(seen), flush=True)
"""

Truth = list[tuple[int, int, int, int]]  # the child's collections: start, end, generation, found


def gc_child(full: int, python: Path = INTERPRETERS["usdt"]) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [str(python), "-c", CHILD.replace("FULL", str(full))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "ready\n"
    return child


def finish(child: subprocess.Popen[str]) -> Truth:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("go\n")
    child.stdin.flush()
    seen = json.loads(child.stdout.readline())
    assert child.wait(timeout=60) == 0
    return [tuple(s) for s in seen]  # type: ignore[misc]


def probed_via(python: Path) -> str:
    """How the probe will reach the collector of `python` (its libpython's, if it has one)."""
    files = [python.resolve(), *python.resolve().parent.parent.glob("lib/libpython3*.so.1.0")]
    ways = {interpreter_hooks(f).via for f in files if f.exists()}
    return next((w for w in ("usdt", "symbol") if w in ways), "none")


@pytest.mark.parametrize(
    ("via", "linked"), [("usdt", True), ("usdt", False), ("symbol", True)],
    ids=["usdt-linked", "usdt-per-slot", "symbol"],
)  # fmt: skip
def test_full_collections_are_reported_with_generation_and_duration(via: str, linked: bool) -> None:
    """linked: the markers' one program per marker, its slot the uprobe-multi link's
    cookie; else each slot's own copy of the programs (kernels without such links)."""
    python = INTERPRETERS[via]
    if not python.exists() or probed_via(python) != via:
        pytest.fail(f"{python}: no interpreter probed via {via} here (the set-up installs both)")
    child = gc_child(full=6, python=python)
    truth: Truth = []
    rec: Recorded = run_probes(
        ["python_gc"],
        lambda: truth.extend(finish(child)),
        watch=WatchSpec(pids={child.pid}),
        options={"python_gc": {"uprobe_multi": linked}},
        settle_s=1.2,
    )
    status = rec.status("python_gc")
    assert status.state == "running" and f"probed via {via}" in status.reason, status.reason
    assert "no GC probe" not in status.reason  # a launcher linked to libpython is no interpreter
    check_full(truth, rec.of(GcPause, tgid=child.pid, generation=2), child.pid, 6)
    young = [h for h in rec.of(Log2Hist, probe="python_gc") if h.name == "gc.gen0"]
    assert sum(n for _, n in (b for h in young for b in h.buckets)) > 0


def check_full(truth: Truth, pauses: list[GcPause], tid: int, n: int) -> None:
    """The child's n full collections (2 ms or more each, as it timed them) are one pause
    each, inside it, with the objects the child saw it find (the marker's argument or the
    collector's return, read where that build keeps it)."""
    full = [(t0, t1, found) for t0, t1, gen, found in truth if gen == 2 and t1 - t0 >= 2 * MS]
    assert len(full) == n, truth
    for t0, t1, found in full:
        # gc.callbacks wrap the markers: the probe's collection lies inside, almost all of it.
        inside = [p for p in pauses if t0 <= p.ts_ns and p.ts_ns + p.dur_ns <= t1]
        assert len(inside) == 1, (t0, t1, pauses)
        assert 0.8 * (t1 - t0) <= inside[0].dur_ns <= t1 - t0
        assert inside[0].tid == tid and inside[0].collected == found > 0


@pytest.mark.parametrize("linked", [True, False], ids=["linked", "per-slot"])
def test_each_interpreter_file_reads_its_own_slot(linked: bool, tmp_path: Path) -> None:
    """Two interpreter files (a copy of the python is a file of its own): the second
    watched takes the second slot, whose markers' arguments its programs read (the
    generation) from its own entry, by the link's cookie or by being its slot's copy."""
    if probed_via(INTERPRETERS["usdt"]) != "usdt":
        pytest.fail("this venv's python has no GC markers (the set-up's python has them)")
    copy = tmp_path / INTERPRETERS["usdt"].resolve().name
    shutil.copy2(INTERPRETERS["usdt"].resolve(), copy)
    watch = WatchSpec()
    children: list[subprocess.Popen[str]] = []
    truths: list[Truth] = []

    def load() -> None:
        for python in (INTERPRETERS["usdt"], copy):
            children.append(gc_child(full=3, python=python))
            watch.pids.add(children[-1].pid)
            time.sleep(2.2)  # the watched set refreshed, its file's slot taken in this order
        truths.extend(finish(child) for child in children)

    rec = run_probes(["python_gc"], load, watch=watch,
                     options={"python_gc": {"uprobe_multi": linked}}, settle_s=1.2)  # fmt: skip
    assert rec.status("python_gc").reason.count("probed via usdt") == 2, rec.status("python_gc")
    for child, truth in zip(children, truths, strict=True):
        check_full(truth, rec.of(GcPause, tgid=child.pid, generation=2), child.pid, 3)


def test_a_process_not_watched_is_not_reported() -> None:
    if probed_via(INTERPRETERS["usdt"]) != "usdt":
        pytest.fail("this venv's python has no GC markers (the set-up's python has them)")
    child = gc_child(full=3)
    rec = run_probes(
        ["python_gc"],
        lambda: finish(child),
        watch=WatchSpec(pids={1}),
        settle_s=1.2,
    )
    assert rec.of(GcPause, tgid=child.pid) == []


def test_programs_that_came_after_the_sampled_second_are_pending_not_unmeasured() -> None:
    """With the kernel's statistics off, the cost is sampled one second a minute, from the
    start. An interpreter watched after that second brings the probe's programs: their cost
    is "pending" (the next second measures it), not "" (no programs, or refused)."""
    sysctl = Path("/proc/sys/kernel/bpf_stats_enabled")
    before = sysctl.read_text().strip()
    sysctl.write_text("0")
    watch = WatchSpec()
    children: list[subprocess.Popen[str]] = []

    def load() -> None:
        time.sleep(1.5)  # past the sampled second that opened at the start
        children.append(gc_child(full=1))
        watch.pids.add(children[0].pid)
        time.sleep(2.5)  # the watched set refreshed, the uprobe attached, a tick or two

    try:
        rec = run_probes(["python_gc"], load, watch=watch)
    finally:
        sysctl.write_text(before)
        for child in children:
            finish(child)
    last = rec.of(ProbeStatus, probe="python_gc")[-1]
    assert (last.state, last.bpf_ns_per_s, last.cost_from) == ("running", -1, "pending"), last
