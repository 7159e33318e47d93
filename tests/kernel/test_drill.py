"""Every drill scenario end to end on this kernel, CI-sized (three 25 ms stalls in 4 s): the
stub feeding loop, the real probes and the daemon's pipeline, scored against the stalls the
loop injected; plus the CLI with a kept trace that `gpujitter report` replays to the same
attributions, and a drill stopped by SIGINT that leaves the system as it found it. Where
this VM cannot meet a target (docs/accuracy.md says why and by how much), the test asserts
what the drill does measure instead."""

from __future__ import annotations

import functools
import json
import mmap
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpujitter.daemon.analysis.records import (
    AllocEvidence,
    Attribution,
    Evidence,
    FaultEvidence,
    GcEvidence,
    GilEvidence,
    IdleEvidence,
    IoEvidence,
    IrqEvidence,
    MigrationEvidence,
    NodeEvidence,
    TaskEvidence,
)
from gpujitter.daemon.drill import system
from gpujitter.daemon.drill.injectors import AllocatorStall
from gpujitter.daemon.drill.runner import WORK_ROOT, DrillOptions, DrillResult, run_drill
from gpujitter.daemon.drill.score import named_frames
from gpujitter.daemon.drill.system import MEMCG_V1
from gpujitter.daemon.sinks.trace import TraceReader
from gpujitter.probes import registry
from gpujitter.probes.events import CudaCall, to_record

GPUJITTER = Path(sys.executable).with_name("gpujitter")
MS = 1_000_000
TICK_NS = 4 * MS  # Debian's kernels tick at 250 Hz
CI: dict[str, Any] = {"duration_s": 4.0, "stalls": 3, "stall_ms": 25.0}


def drill(name: str, **options: Any) -> DrillResult:
    return run_drill(name, DrillOptions(backend="stub", **{**CI, **options}), lambda text: None)


def rows(r: DrillResult) -> str:
    """What went wrong, for a failed assertion."""
    lines = [f"{r.scenario}: targets {r.score.targets}"]
    lines += [
        f"  stall {s.index}: {s.injected_ns / 1e6:.1f} ms, top {s.top_cause or '-'}, "
        f"{ {c: round(ns / 1e6, 2) for c, ns in s.parts.items()} }, truth {s.truth_ns / 1e6:.2f}"
        f", outside contention {s.outside_ns / 1e6:.2f}"
        for s in r.score.stalls
    ]
    lines += [f"  false gap {g.ts_ns}..{g.end_ns} {g.parts}" for g in r.score.false_gaps]
    if r.score.self_inflicted:
        lines.append(f"  self-inflicted: {r.score.self_inflicted} gaps, "
                     f"{r.score.self_inflicted_ns / 1e6:.2f} ms")  # fmt: skip
    return "\n".join(lines)


def outside_contention(r: DrillResult) -> list[str]:
    """Gaps outside the stalls that are not the feeder waiting on the run queue behind a
    task of the VM's other load (real gaps: the stub's GPU idled while the feeder was
    runnable in a synchronisation; on 2 shared CPUs they happen)."""
    stalls = [(s["t0_ns"], s["t1_ns"]) for s in r.stalls]
    wrong = []
    for a in r.attributions:
        if any(a.ts_ns < t1 and t0 < a.end_ns for t0, t1 in stalls):
            continue
        tasks = [e for p in a.parts if p.cause == "runq_wait" for e in p.evidence
                 if isinstance(e, TaskEvidence)]  # fmt: skip
        if a.top_cause != "runq_wait" or any(t.comm.startswith("gj-drill") for t in tasks):
            wrong.append(f"{a.ts_ns}..{a.end_ns} {a.top_cause} {[t.comm for t in tasks]}")
    return wrong


def assert_meets_targets(r: DrillResult) -> None:
    met = bool(r.score.stalls) and r.score.passed
    assert met, rows(r)


# A step this long between first touches of fresh pages is the hypervisor backing the page
# (docs/accuracy.md, "The fault storm's truth"); the faults probe cannot time it.
SLOW_TOUCH_NS = 20_000
SLOW_MACHINE_SHARE = 0.05  # of first-touch time in such steps: a healthy machine has ~none


@functools.cache
def slow_first_touch() -> float:
    """The least share, over 3 rounds, of the CPU time a first touch of 64 MiB of fresh
    anonymous pages spends in steps over SLOW_TOUCH_NS. By the thread's CPU clock: the
    host's backing a page is the guest thread's CPU time, a preemption (a hog beside the
    suite) is not; the least of three, for what an interrupt storm adds to one."""
    shares = []
    for _ in range(3):
        with mmap.mmap(-1, 16384 * 4096) as m:
            slow = 0
            start = prev = time.thread_time_ns()
            for offset in range(0, len(m), 4096):
                m[offset] = 1
                now = time.thread_time_ns()
                if now - prev > SLOW_TOUCH_NS:
                    slow += now - prev
                prev = now
            shares.append(slow / max(1, prev - start))
    return min(shares)


def assert_meets_fault_targets(r: DrillResult) -> None:
    """The fault drills' targets. On a machine whose fresh pages are slow at random (a VM
    whose free memory goes back to its host), faults slower than the probe's storm rule can
    time are read as host work: there the two targets that time moves (top cause,
    attributed) are expected to miss, and the test says so with the machine's figure,
    while every other target still holds."""
    missed = {t for t, met in r.score.targets.items() if not met}
    if r.score.stalls and missed and missed <= {"top_cause", "attributed"}:
        share = slow_first_touch()
        if share >= SLOW_MACHINE_SHARE:
            pytest.xfail(
                f"{sorted(missed)} missed on a machine whose fresh pages are slow: "
                f"{share:.0%} of a first touch in steps over {SLOW_TOUCH_NS // 1000} µs\n" + rows(r)
            )
    assert_meets_targets(r)


def overlaps(a: Attribution, stall: dict[str, Any]) -> bool:
    """Does the attribution's gap overlap the injected stall?"""
    return a.ts_ns < stall["t1_ns"] and stall["t0_ns"] < a.end_ns


def evidence(r: DrillResult, cause: str, kind: type[Evidence]) -> list[list[Any]]:
    """Per attribution that overlaps a stall: the evidence of that kind in its `cause` part."""
    out = []
    for a in r.attributions:
        if any(overlaps(a, s) for s in r.stalls):
            parts = [p for p in a.parts if p.cause == cause]
            out.append([e for p in parts for e in p.evidence if isinstance(e, kind)])
    return out


def test_malloc_munmaps_are_allocator_stalls() -> None:
    r = drill("malloc")
    assert_meets_targets(r)
    found_by_stall = evidence(r, "alloc_stall", AllocEvidence)
    for found, stall, scored in zip(found_by_stall, r.stalls, r.score.stalls, strict=True):
        munmaps = [e for e in found if e.call == "munmap"]
        assert [e.count for e in munmaps] == [stall["munmaps"]], rows(r)
        # The loop maps its pool's next blocks (8 MiB, populated) while the GPU is busy:
        # outside load can stretch the stall's gap over such an mmap (the suite under a hog
        # on the feeding CPU), which is then named as what it is, never as the stall.
        others = [e for e in found if e.call != "munmap"]
        block = AllocatorStall.CHUNK_BYTES
        assert all(e.call == "mmap" and e.bytes == e.count * block for e in others), rows(r)
        if not scored.outside_ns:
            assert all(e.ns < munmaps[0].ns for e in others), rows(r)


def test_gc_collections_are_gc_pauses_with_their_generation() -> None:
    r = drill("gc")
    assert_meets_targets(r)
    assert r.score.stalls and all(s.truth_ns >= 10 * MS for s in r.score.stalls), rows(r)
    for found, stall in zip(evidence(r, "gc_pause", GcEvidence), r.stalls, strict=True):
        pairs = [(e.generation, e.count) for e in found]
        assert pairs[0] == (2, stall["full_collections"]), rows(r)
        # A young collection that the loop's own allocations set off inside the stall's
        # window is evidence too: under load (the stall waits out other work) the window
        # widens enough to catch one now and then, e.g. [(2, 2), (0, 1)].
        assert all(generation < 2 for generation, _ in pairs[1:]), rows(r)


def test_gil_waits_name_the_thread_holding_the_gil() -> None:
    r = drill("gil")
    assert_meets_targets(r)
    # The holder runs Python (host work), unless the shared VM's other load holds its CPU
    # while it holds the GIL: then it waits on the run queue itself, and says so.
    for found in evidence(r, "gil_wait", GilEvidence):
        assert found[0].holder_comm == "gj-drill-gil", rows(r)
        assert found[0].holder_cause in ("host_work", "runq_wait"), (found, rows(r))


@pytest.mark.parametrize(
    ("scenario", "cause", "kind"),
    [
        ("swap", "swap_in", "swap"),  # the cgroup limit forces real swap-ins
        ("filefaults", "major_fault", "file"),  # the dropped page cache makes reads go to disk
    ],
)
def test_major_faults_in_the_feeding_thread(scenario: str, cause: str, kind: str) -> None:
    r = drill(scenario)
    assert_meets_fault_targets(r)
    for found, stall in zip(evidence(r, cause, FaultEvidence), r.stalls, strict=True):
        assert stall["majflt"] > 50, "the stall must take real major faults"
        assert found[0].kind == kind
        assert abs(found[0].count - stall["majflt"]) <= 0.1 * stall["majflt"], rows(r)


def test_sequential_read_waits_on_the_disk() -> None:
    """The throttle holds each stall to the end of its 100 ms slice (docs/accuracy.md): the
    stalls run ~110 ms for 25 asked, nearly all of it waiting on the disk."""
    r = drill("readahead")
    assert_meets_targets(r)
    disk = system.whole_disk(WORK_ROOT)  # where the drill's file is
    for found in evidence(r, "io_wait", IoEvidence):
        assert [(e.dev, e.op) for e in found] == [(disk, "read")], rows(r)
        assert found[0].count >= 1 and found[0].bytes > 0, rows(r)


def test_minor_fault_storm() -> None:
    """Each stall's faults are counted within 10 %, less the last window of each, which the
    probe never streams when its fault time stays under the `minor` threshold
    (docs/accuracy.md): on a busy machine a stall holds fewer faulting ms, and that window
    weighs more."""
    r = drill("faults")
    assert_meets_fault_targets(r)
    unstreamed_ns = registry.get("faults").thresholds["minor"]
    for found, stall in zip(evidence(r, "minor_faults", FaultEvidence), r.stalls, strict=True):
        tail = unstreamed_ns * found[0].count // max(1, found[0].ns)  # faults in that window
        assert -0.1 * stall["minflt"] <= stall["minflt"] - found[0].count, rows(r)
        assert stall["minflt"] - found[0].count <= 0.1 * stall["minflt"] + tail, rows(r)


def test_cpu_bound_host_step() -> None:
    assert_meets_targets(drill("compute"))


def test_pyhot_names_the_python_function_with_file_and_line(tmp_path: Path) -> None:
    """The target: the injected function is the top frame of host work in >= 90 % of the
    gaps of its stalls; replaying the drill's trace gives the same frames. Scored over the
    gaps whose host work lasted a sampling period or more: on this shared VM another task
    can hold the feeding CPU for most of a stall, and that time is correctly the run
    queue's, with the samples taken in it (the thread was runnable: R). Under a one-CPU hog
    the feeder runs about half of each 25 ms stall, so two periods left no gap to score."""
    trace = tmp_path / "pyhot.gjtrace"
    r = drill("pyhot", keep_trace=trace)
    assert_meets_targets(r)
    frames = named_frames(r.stalls, r.attributions)
    assert frames["gaps"] and frames["named"] >= 0.9 * frames["gaps"], (frames, rows(r))
    report = subprocess.run(
        [str(GPUJITTER), "report", "--json", str(trace)], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    replayed = json.loads(report.stdout)["attributions"]
    assert replayed == json.loads(json.dumps([to_record(a) for a in r.attributions]))


def test_contention_names_the_hog() -> None:
    r = drill("contention")
    assert_meets_targets(r)
    # A busy machine adds tasks of its own beside the hog (scored as outside contention).
    for found in evidence(r, "runq_wait", TaskEvidence):
        assert "gj-drill-hog" in [e.comm for e in found], rows(r)


def runq_in_sync(r: DrillResult) -> list[Attribution]:
    """Every stall found, each gap inside one a run-queue wait whose time is within 20 % of
    the truth (drain to return), nothing else but contention from outside: the attributions
    inside the stalls."""
    assert r.score.stalls and r.score.targets["found_all"], rows(r)
    spans = [(t["t0_ns"], t["t1_ns"]) for t in r.stalls]
    in_stalls = [a for a in r.attributions if any(a.ts_ns < y and x < a.end_ns for x, y in spans)]
    assert in_stalls and all(a.top_cause == "runq_wait" for a in in_stalls), rows(r)
    runq = sum(p.ns for a in in_stalls for p in a.parts if p.cause == "runq_wait")
    truth = sum(t["cause_ns"] for t in r.stalls)
    assert abs(runq - truth) <= 0.2 * truth, rows(r)
    assert not outside_contention(r), rows(r)
    return in_stalls


def test_a_hog_landing_inside_a_synchronisation() -> None:
    """The hog takes the feeder's CPU while it sleeps in cuStreamSynchronize: the stub's
    timerfd wakes it at the drain, and the gap runs from that wake-up to the sync's return,
    the run-queue wait. The task named is the one that held the CPU longest during the wait:
    the hog, unless outside load on this VM held it longer in the same wait.

    Read off the attributions as made, not the score's outside-contention split: a wait
    names one task, its longest holder (docs/probes.md), and the split counts the whole wait
    as outside when that was not the hog."""
    r = drill("sync-contention")
    runq_in_sync(r)
    named = [e.comm for found in evidence(r, "runq_wait", TaskEvidence) for e in found]
    assert "gj-drill-hog" in named, rows(r)


def test_a_hog_preempting_a_spinning_synchronisation() -> None:
    """The hog preempts the feeder while it spins in cuStreamSynchronize (the stub's spinning
    mode, CUDA's default): no wake-up marks the drain, and the node has no NVML, so no idle
    floor. The feeder's clean syncs place the drain inside the preemption (`baseline`, at
    their spread), never before the drain by more than that: a sync whose launches were
    themselves late waits for less work than usual and is placed late (idle understated).
    The hog is not asserted named: the probe names the task that held the CPU longest
    during the wait, and on a loaded VM outside work can hold it longer than the hog."""
    r = drill("sync-spin")
    drains = [t["t0_ns"] for t in r.stalls]
    for a in runq_in_sync(r):
        assert "baseline" in a.sources and a.confidence < 0.8, rows(r)
        drain = max(t for t in drains if t < a.end_ns)
        assert a.ts_ns >= drain - a.resolution_ns - 200_000, rows(r)


def test_a_hog_preempting_the_thread_before_it_reaches_its_synchronisation(
    tmp_path: Path,
) -> None:
    """The H200 real job's miss (issue 11): with its step's work queued, the feeder wakes the
    hog, which preempts it before it calls cuStreamSynchronize (the stub's spinning mode);
    the sync, reached after the drain, returns at once. The probe reports that sync with
    the quiet stretch before it, and the feeder's clean syncs ("last launch to drain")
    place the drain: `baseline` gaps below 0.8, within their resolution of the drain."""
    r = drill("sync-late", keep_trace=tmp_path / "late.gjtrace")
    drains = [t["t0_ns"] for t in r.stalls]
    for a in runq_in_sync(r):
        assert "baseline" in a.sources and a.confidence < 0.8, rows(r)
        drain = max(t for t in drains if t < a.end_ns)
        assert abs(a.ts_ns - drain) <= a.resolution_ns + 200_000, rows(r)
    with TraceReader(tmp_path / "late.gjtrace") as trace:
        syncs = [e for e in trace if isinstance(e, CudaCall) and e.api == "sync"]
    for stall in r.stalls:  # each stall ends at a sync that returned at once, after quiet
        (late,) = [e for e in syncs if stall["t0_ns"] < e.ts_ns < stall["t1_ns"]]
        assert late.dur_ns < MS and late.ts_ns - late.after_idle_ns < stall["t0_ns"], rows(r)


def test_attached_to_a_loop_already_busy() -> None:
    """The probes attach while the loop keeps the GPU busy (the daemon started under a
    running job): no gap, from the attach on."""
    r = drill("attach-busy")
    assert r.score.stalls == () and r.feeder["done"]["steps"] > 300, rows(r)
    assert not outside_contention(r), rows(r)


def test_migration_to_a_remote_node() -> None:
    """Where the machine has a CPU that is neither the feeder's nor the remote one, the
    daemon keeps to it and every target holds. On two CPUs it has none: the feeder, moved
    onto the CPU gpujitter's threads keep to, can wait behind one of them until the next
    scheduler tick (a migrated task has no sleeper's credit to preempt with). That wait is
    real and must be reported as gpujitter's own, no longer than a tick (and the wake-up
    after it) per wait, while every other target holds (docs/accuracy.md). A gap can hold
    such a wait behind each of two threads: 2.9 + 2.2 ms in one, 2026-12-06."""
    r = drill("migrate")
    assert r.topology_override is not None
    if len(os.sched_getaffinity(0)) > 2:
        assert_meets_targets(r)
    else:
        missed = [t for t, met in r.score.targets.items() if not met and t != "no_self_inflicted"]
        assert r.score.stalls and not missed, rows(r)
        own = [e for a in r.attributions for p in a.parts for e in p.evidence
               if isinstance(e, TaskEvidence) and e.own]  # fmt: skip
        for e in own:
            assert e.ns <= e.count * (TICK_NS + MS), rows(r)
    for nodes in evidence(r, "remote_oncpu", NodeEvidence):
        assert [n.node for n in nodes] == [1], rows(r)
    for moves in evidence(r, "remote_oncpu", MigrationEvidence):
        assert moves and moves[-1].dst_node == 1 and moves[-1].src_node == 0, rows(r)


def test_disk_interrupts_on_the_feeding_cpu() -> None:
    """This VM's disk steals ~10-15 % of a CPU at most: the stall stays mostly the loop's own
    work (host_work), with the IRQ's time beside it. The irq probe times handlers only, not
    the interrupt entry and exit around them (and, in a VM, the exits to the hypervisor),
    which the loop's clock sees too: its share of the loop's measure is asserted loosely.
    That share moves with the VM's host: 0.72-0.75 on 11-30, 0.42-0.60 on 12-05 (18-35 µs
    a disk interrupt outside its handlers; the tree of 12-04 read the same), under 0.4 once
    in a CI run beside a hog."""
    r = drill("irq")
    s = r.score
    assert s.found == s.injected and not s.false_gaps, rows(r)
    for stall, scored in zip(r.stalls, s.stalls, strict=True):
        found = [e for a in r.attributions if overlaps(a, stall)
                 for p in a.parts if p.cause == "irq"
                 for e in p.evidence if isinstance(e, IrqEvidence)]  # fmt: skip
        top = max(found, key=lambda e: e.ns)
        # The handlers counted are those that interrupted the loop: where outside load held
        # its CPU for part of the stall (the suite under a hog: 36 in 25 ms, half of it
        # waiting), only that part's share of them. How many there are is the disk's: over
        # 50 in 25 ms here, 47 on the CI machine of 12-06 (its reads slower); a loop that no
        # disk interrupted counts a few timer ticks at most.
        ran = 1 - scored.outside_ns / scored.injected_ns
        assert top.irq_kind in ("hardirq", "softirq") and top.count > 20 * ran, rows(r)
    assert 0.3 * s.truth_ns <= s.attributed_ns <= 1.2 * s.truth_ns, rows(r)


def test_idle_wakeups() -> None:
    """Without a cpuidle driver the CPUs idle in HLT: a wake-up from it costs microseconds,
    so the stall stays the sleeps themselves (blocked). The loop's measure of the cause is
    each sleep's lateness, which also holds the timer interrupt's way out of HLT before the
    wake-up; idle_wake is wake-up to running: a part of it. On a busy machine a wake-up
    finds its CPU running another task instead: that wait is run-queue wait, taken out of
    the lateness the attribution is held to."""
    r = drill("cstate")
    s = r.score
    assert s.found == s.injected and not s.false_gaps, rows(r)
    idle, behind = evidence(r, "idle_wake", IdleEvidence), evidence(r, "runq_wait", TaskEvidence)
    onto_idle = onto_busy = 0
    for woke, waited, stall in zip(idle, behind, r.stalls, strict=True):
        onto_idle += sum(e.count for e in woke)
        onto_busy += sum(e.count for e in waited)
        assert sum(e.count for e in woke + waited) >= stall["wakes"] // 2, rows(r)
    # Only wake-ups onto an idle CPU can be idle_wake: the lower bound scales with their share.
    share = onto_idle / max(1, onto_idle + onto_busy)
    assert 0.2 * share * s.truth_ns <= s.attributed_ns <= s.truth_ns, rows(r)


def test_the_control_has_no_gap() -> None:
    r = drill("clean", duration_s=6.0)
    assert r.score.stalls == () and not outside_contention(r), rows(r)
    assert r.feeder["done"]["steps"] > 300  # it did feed: ~10 ms of GPU work a step


def test_cli_json_and_its_trace_replays_to_the_same_attributions(tmp_path: Path) -> None:
    trace = tmp_path / "drill.gjtrace"
    done = subprocess.run(
        [str(GPUJITTER), "drill", "malloc", "--json", "--duration", "4s", "--stalls", "2",
         "--keep-trace", str(trace)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rec = json.loads(done.stdout)
    assert (rec["scenario"], rec["injected"], rec["found"], rec["passed"]) == ("malloc", 2, 2, True)
    assert "stall 2/2" in done.stderr  # progress
    report = subprocess.run(
        [str(GPUJITTER), "report", "--json", str(trace)], capture_output=True, text=True,
        check=True,
    )  # fmt: skip
    assert json.loads(report.stdout)["attributions"] == rec["attributions"]


@pytest.fixture
def page_cluster() -> Iterator[str]:
    path = Path("/proc/sys/vm/page-cluster")
    before = path.read_text()
    yield before
    assert path.read_text() == before


def stopped_at_first_stall(
    scenario: str,
    sig: signal.Signals,
    running: Callable[[], None] = lambda: None,
    group: bool = False,
) -> tuple[subprocess.Popen[str], str]:
    """`gpujitter drill SCENARIO` (8 s, 3 stalls) sent `sig` once it reports its first stall,
    right after `running()` has looked at it; waited for; with what it wrote to stderr after
    the signal. With `group`, the signal goes to its whole process group, as a terminal
    sends Ctrl-C."""
    drill_proc = subprocess.Popen(
        [str(GPUJITTER), "drill", scenario, "--duration", "8s", "--stalls", "3"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, start_new_session=group,
    )  # fmt: skip
    assert drill_proc.stderr is not None
    try:
        for line in drill_proc.stderr:
            if "stall 1/3" in line:
                break
        running()
        if group:
            os.killpg(drill_proc.pid, sig)
        else:
            drill_proc.send_signal(sig)
        after = drill_proc.communicate(timeout=60)[1]
    finally:
        if drill_proc.poll() is None:
            drill_proc.kill()
    return drill_proc, after


def test_sigint_leaves_the_system_as_it_was(page_cluster: str) -> None:
    scratch_before = set(Path("/var/tmp").glob("gpujitter-drill-*"))  # a killed run's leftovers

    def changed() -> None:
        assert Path("/proc/sys/vm/page-cluster").read_text().strip() == "0"
        assert "gpujitter-drill-" in Path("/proc/swaps").read_text()

    drill_proc, _ = stopped_at_first_stall("swap", signal.SIGINT, changed)
    assert drill_proc.returncode == 130
    assert "gpujitter-drill-" not in Path("/proc/swaps").read_text()
    assert not list(MEMCG_V1.glob(f"gpujitter-drill-{drill_proc.pid}"))
    assert set(Path("/var/tmp").glob("gpujitter-drill-*")) == scratch_before
    leftovers = subprocess.run(["pgrep", "-f", "gpujitter.daemon.drill"], capture_output=True)
    assert leftovers.stdout == b"", "the feeding loop or a helper outlived the drill"


def test_ctrl_c_on_a_terminal_prints_no_traceback() -> None:
    """A terminal's Ctrl-C reaches the drill's children too (the feeding loop, the hog):
    each printed a KeyboardInterrupt traceback beside the drill's clean exit."""
    drill_proc, after = stopped_at_first_stall("contention", signal.SIGINT, group=True)
    assert drill_proc.returncode == 130
    assert "Traceback" not in after, after


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_no_process_of_a_stopped_drill_outlives_it(sig: signal.Signals) -> None:
    """The loader drill has a child of a child: the worker the feeding loop forks. Stopped
    by SIGTERM, the drill SIGKILLs its feeding loop, which left the worker waiting on its
    queue for good (4 stops in 7, 2026-12-05); killed outright, the drill stops nothing.
    Every process of it dies with its parent either way. (A SIGKILL leaves its work folder.)"""
    scratch_before = set(Path("/var/tmp").glob("gpujitter-drill-*"))
    try:
        stopped_at_first_stall("loader", sig)
    finally:
        for folder in set(Path("/var/tmp").glob("gpujitter-drill-*")) - scratch_before:
            shutil.rmtree(folder, ignore_errors=True)
    deadline = time.monotonic() + 5  # a parent's death signal is delivered as it exits

    def left() -> bytes:
        return subprocess.run(["pgrep", "-f", "gpujitter.daemon.drill"], capture_output=True).stdout

    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left() == b"", "a process of the drill outlived it"


def test_the_next_drill_puts_back_what_a_killed_one_left(page_cluster: str) -> None:
    """A drill killed outright (SIGKILL, the OOM killer) leaves its swap file on, vm.page-cluster
    at 0, its memory cgroup and its work folder; the next drill puts them back from the
    killed one's undo log, and says so."""
    drill_proc, _ = stopped_at_first_stall("swap", signal.SIGKILL)
    assert drill_proc.returncode == -signal.SIGKILL
    assert Path("/proc/sys/vm/page-cluster").read_text().strip() == "0"  # what a kill leaves
    assert "gpujitter-drill-" in Path("/proc/swaps").read_text()
    notes = system.recover_killed(WORK_ROOT)
    assert any("page-cluster changed: put back to " + page_cluster.strip() in n for n in notes)
    assert any("swapped off" in n for n in notes), notes
    assert all(f"(pid {drill_proc.pid})" in n for n in notes), notes
    assert "gpujitter-drill-" not in Path("/proc/swaps").read_text()
    assert not list(MEMCG_V1.glob(f"gpujitter-drill-{drill_proc.pid}"))
    assert not [f for f in WORK_ROOT.glob("gpujitter-drill-*") if (f / "undo.jsonl").exists()]
    assert system.recover_killed(WORK_ROOT) == []  # nothing left to put back


def test_loader_names_the_worker_process_that_computed_the_batch() -> None:
    """The feeder waits on a queue filled by an intermediate thread from a worker process's
    result queue: the wait is followed three wakers down (intermediate thread, the worker's
    queue feeder thread, the worker), into a process forked after the probes started. On
    these 2 CPUs the worker shares its CPU with the drill and whatever else runs: time it
    was preempted is run-queue wait, rightly, and may top a stall; the truth is its CPU time
    while it computed, and run-queue wait must fit in the rest of the stall."""
    r = drill("loader")
    s = r.score
    assert s.found == s.injected and not s.false_gaps, rows(r)
    assert s.targets["attributed"], rows(r)
    for st, stall in zip(s.stalls, r.stalls, strict=True):
        (a,) = [a for a in r.attributions if overlaps(a, stall)]
        (worker,) = [t for t in a.threads if t.tgid == stall["culprit_tgid"] and t.hops == 3]
        assert (worker.role, worker.comm, worker.tid) == ("waker", "gj-loader-wkr", worker.tgid)
        own = {c.cause: c.ns for c in worker.causes}
        assert own["host_work"] >= 0.8 * stall["cause_ns"], rows(r)
        # Contention is only ever the stall's time outside the worker's own work.
        assert st.parts.get("runq_wait", 0) <= st.injected_ns - stall["cause_ns"] + MS, rows(r)
        if stall["worker_preempted_ns"] < 0.2 * stall["compute_ns"]:
            assert st.top_cause == "host_work" and st.culprit.startswith("gj-loader-wkr"), rows(r)


@pytest.fixture
def one_cpu_hog() -> Iterator[int]:
    """A busy loop outside the drill pinned to the feeder's CPU (the highest: the drills'
    default), as a shared machine has: everything the drill's threads wait behind it is
    outside contention (issue 11 item 9). Yields its pid."""
    cpu = max(os.sched_getaffinity(0))
    hog = subprocess.Popen(["taskset", "-c", str(cpu), "sh", "-c", "while :; do :; done"])
    try:
        yield hog.pid
    finally:
        hog.kill()
        hog.wait()


def assert_found_right_and_within(r: DrillResult) -> None:
    """Issue 11's targets under outside load: every stall of 10 ms or more found, the top
    cause right, the injected cause's time within ±20 % of the truth, no false gap."""
    wanted = ("found_all", "top_cause", "attributed", "no_false_gaps")
    assert r.score.stalls and all(r.score.targets[t] for t in wanted), rows(r)


def test_a_spinning_synchronisation_preempted_under_a_one_cpu_hog(one_cpu_hog: int) -> None:
    """With a busy loop sharing the feeder's CPU no sync is free of run-queue wait: the drain
    is placed by the syncs that were preempted before it and spun on (docs/gpu.md). The
    loop's other preemptions by the busy loop across a drain are real gaps, the busy
    loop's (outside contention, not false)."""
    r = drill("sync-spin")
    assert_found_right_and_within(r)
    assert not outside_contention(r), rows(r)


def test_the_loader_worker_under_a_one_cpu_hog(one_cpu_hog: int) -> None:
    """The worker's time waiting behind outside load is run-queue wait naming that task, not
    its host work; the truth (its compute less the time it was preempted) holds none of it,
    and the feeder's own host work in the gap is not the worker's: held to ±20 %."""
    r = drill("loader")
    assert_found_right_and_within(r)
    assert r.score.targets["culprit"], rows(r)
    for st in r.score.stalls:  # stall by stall, the worker's own time against its CPU time
        assert abs(st.attributed_ns - st.truth_ns) <= 0.2 * st.truth_ns + MS, rows(r)


def test_attached_to_a_busy_loop_under_a_one_cpu_hog(one_cpu_hog: int) -> None:
    """No gap invented under outside load: the feeder preempted by the busy loop while the
    GPU drained is a real gap, attributed to run-queue wait behind it."""
    r = drill("attach-busy")
    assert r.score.stalls == () and not r.score.false_gaps, rows(r)
    assert not outside_contention(r), rows(r)
