"""cstate probe on the real kernel: sleeps that wake onto an idle CPU are reported with the
idle state and an idle time matching the sleep, idle residency per CPU agrees with the
kernel's own idle accounting (/proc/stat) and, sample by sample, with a raw log of the CPU's
idle stretches split at each read, the threshold filters in the kernel while the
histograms count every wake-up, and unwatched processes produce nothing."""

from __future__ import annotations

import bisect
import itertools
import os
import statistics
import threading
import time

import pytest

from gpujitter.probes.cstate import idle_states
from gpujitter.probes.events import CpuStats, IdleWake, Log2Hist, OffCpu, ThreadSched
from gpujitter.probes.host import HostPaths
from gpujitter.probes.runner import ProbeSet
from gpujitter.probes.topology import load_topology
from gpujitter.probes.watch import WatchSpec
from tests.kernel.conftest import run_probes
from tests.kernel.sched_load import (
    IDLE_STAMPER,
    Child,
    Logged,
    hog,
    idle_log,
    idle_ticks,
    quietest_cpu,
    sleep_log,
    together,
    untraced_switch_ins,
    unwoken_sleeps,
)

MS = 1_000_000
USER_HZ = 100  # /proc/stat's unit is 1/USER_HZ s
# The log's program and the probe's run one after the other on the same tracepoint, a few
# us apart; on this VM the host can take the vCPU between them (10.7 and 21.6 us seen, CI and
# a loaded run, 2026-12-01/02), against intervals of milliseconds that the test compares.
LOG_SLACK_NS = 50_000
# A sample's ends are the probe's reads: a copy of the words, then the clock. A stretch that
# begins or ends between the two lands in the sample after, by that gap (microseconds).
READ_SLACK_NS = 20_000
# Now and then the host takes the vCPU between the two programs for longer than the slack:
# a switch-in the log timed 101 us from the probe (CI, 2026-12-02); between two programs
# on cpu_idle, 107-169 us 3 times in 40 s of idle stretches here (2026-12-02), ~1 ms at most
# seen. One comparison of each kind a run may be off by that much (Stolen); a second, or a
# larger one, is the probe's error.
STOLEN_MAX_NS = MS


class Stolen:
    """One kind of comparison with the log, over a run: at most one may miss its slack, by
    less than STOLEN_MAX_NS beyond it (the vCPU taken between the two programs once)."""

    def __init__(self) -> None:
        self.off_ns: list[int] = []

    def beyond(self, off_ns: int, slack_ns: int, what: object) -> int:
        """0 for a comparison (of `what`) off by off_ns, probe against log, within slack_ns;
        else off_ns, the run's one steal, which must stay below the bound."""
        if off_ns <= slack_ns:
            return 0
        self.off_ns.append(off_ns)
        assert len(self.off_ns) == 1, (f"off by {self.off_ns} ns, {slack_ns} allowed", what)
        assert off_ns < slack_ns + STOLEN_MAX_NS, (f"off by {off_ns} ns, {slack_ns} allowed", what)
        return off_ns


def sleeper(cpu: int) -> Child:
    """Pinned to `cpu`, the child sleeps 10 ms 21 times; nothing else of ours runs there, so
    each sleep leaves the CPU idle (unless another task runs) and the timer wakes the child
    onto it."""
    return Child(
        f"""
    pin({cpu})
    time.sleep(0.01)
    out["t0"] = time.monotonic_ns()
    for _ in range(20):
        time.sleep(0.01)
    out["t1"] = time.monotonic_ns()
"""
    )


def wake_counts(rec: object, name_prefix: str = "wake_to_run.") -> dict[str, int]:
    counts: dict[str, int] = {}
    for h in rec.of(Log2Hist, probe="cstate"):  # type: ignore[attr-defined]
        if h.name.startswith(name_prefix):
            state = h.name[len(name_prefix) :]
            counts[state] = counts.get(state, 0) + sum(n for _, n in h.buckets)
    return counts


# Alone, cstate runs its own sched_switch and sched_waking programs; beside sched, sched's
# programs run its share of both events (one program per hook, cstate.bpf.c).
@pytest.mark.parametrize("names", [["cstate"], ["sched", "cstate"]], ids=["alone", "carried"])
def test_sleeps_wake_onto_an_idle_cpu_with_state_and_idle_time(names: list[str]) -> None:
    # Other tasks may run on the CPU during a sleep (this machine is shared), so each wake-up
    # is checked against a raw log of that CPU's idle entries, exits and switches: when it
    # went idle, which state it entered last, when it left it.
    carried = "sched" in names
    cpu = quietest_cpu()
    with sleeper(cpu) as child, idle_log(cpu) as logged, sleep_log(child.pid) as slept:
        rec = run_probes(
            names,
            child.load,
            watch=WatchSpec(pids={child.pid}),
            thresholds={"cstate": {"wake": 0}},
            settle_s=1.2,
        )
        log = logged()
        unwoken = unwoken_sleeps(slept(), child.pid)
    res = child.result
    wakes = [w for w in rec.of(IdleWake, tid=child.pid) if res["t0"] <= w.ts_ns <= res["t1"]]
    names = idle_states(HostPaths(), [cpu])[cpu]
    switches = [e for e in log if e.kind == "switch"]
    switch_in_stolen, idle_stolen = Stolen(), Stolen()
    from_idle = [
        e
        for e in switches
        if e.next_pid == child.pid and e.prev_pid == 0 and res["t0"] <= e.ts_ns <= res["t1"]
    ]
    # A precondition, not the probe: other work kept the CPU busy if this fails.
    assert len(from_idle) >= 5, f"CPU {cpu} was seldom idle when the child woke"
    assert len(wakes) >= len(from_idle) - 2  # woken while the CPU idled: every one reported
    for w in wakes:
        assert w.cpu == cpu and w.tgid == child.pid
        assert w.state_name == names[w.state].name
        assert w.exit_latency_ns == names[w.state].exit_latency_ns
        run_ns = w.ts_ns + w.wake_to_run_ns
        switch_in = min(from_idle, key=lambda e: abs(e.ts_ns - run_ns))
        # The same switch-in (the sleeps are 10 ms apart), to the slack or a steal; what the
        # host took there is slack for this wake-up's times too.
        off_ns = abs(switch_in.ts_ns - run_ns)
        slack_ns = LOG_SLACK_NS + switch_in_stolen.beyond(off_ns, LOG_SLACK_NS, (w, switch_in))
        # The CPU's last switch before it: to idle, or onto a task whose switch away the
        # kernel did not trace (this VM's PID-1 agent threads, docs/probes.md), after which
        # the CPU idled again; the probe's idle time starts at the next idle entry either way.
        went_idle = max(e.ts_ns for e in switches if e.ts_ns < switch_in.ts_ns)
        idle_since = min(e.ts_ns for e in log if e.kind == "entry" and e.ts_ns > went_idle)
        entry = max(
            (e for e in log if e.kind == "entry" and e.ts_ns < switch_in.ts_ns),
            key=lambda e: e.ts_ns,
        )
        exit_ns = min(e.ts_ns for e in log if e.kind == "exit" and e.ts_ns >= entry.ts_ns)
        assert w.state == entry.state
        assert w.in_state_ns == pytest.approx(exit_ns - entry.ts_ns, abs=slack_ns)
        # The probe's idle time starts at its first idle entry after the CPU's last switch:
        # it lies within the log's idle stretch, and is all of it to the slack or a steal
        # (the vCPU taken between the two programs at an idle entry or exit; an idle stretch
        # began ~3.5 ms late in ~2 of 10 runs on 2026-12-01, before the untraced switches
        # above were known, and two in one run in CI on 2026-12-02).
        assert w.in_state_ns <= w.idle_ns <= exit_ns - idle_since + slack_ns
        idle_stolen.beyond(abs(w.idle_ns - (exit_ns - idle_since)), slack_ns, (w, idle_since))
        # Not capped by the 10 ms sleep: on this VM a timer can fire late (a 12.4 ms idle
        # stretch in CI, the raw log's too); the log's stretch above is the bound.
        assert 0 < w.in_state_ns <= w.idle_ns
    assert statistics.median(w.wake_to_run_ns for w in wakes) < 500_000
    if carried:
        # Carried: the 10 ms sleeps are streamed by sched (its offcpu threshold is 5 ms), and
        # each wake-up rides in sched's record of the same switch-in, delivered right before
        # that interval (one record, not one in each probe's ring).
        for w in wakes:
            at = next(i for i, e in enumerate(rec.events) if e is w)
            off = rec.events[at + 1]
            assert isinstance(off, OffCpu) and off.tid == w.tid, rec.events[at : at + 2]
            assert (off.runnable_ns, off.end_ns, off.cpu_in) == (
                w.ts_ns, w.ts_ns + w.wake_to_run_ns, w.cpu
            )  # fmt: skip

    # With threshold 0 every wake-up onto an idle CPU was streamed; the histograms counted
    # those and the ones onto a busy CPU: every one of the 21 sleeps after "go" whose
    # wake-up and switch back in the kernel traced. Now and then a sleep's wake-up reaches
    # neither sched_waking nor sched_wakeup (no recursion misses): the child switched in
    # ~10 ms after it slept, from rcu_preempt, with no wake-up traced, so no wake time to
    # measure from; 20 of 21 in 2 of 71 runs with a hog on the other CPU, 2026-12-05 (and CI).
    counts = wake_counts(rec)
    assert sum(n for state, n in counts.items() if state != "busy") == len(
        rec.of(IdleWake, tid=child.pid)
    )
    assert sum(counts.values()) >= 21 - untraced_switch_ins(log, child.pid) - unwoken
    assert rec.status("cstate").lost_kernel == 0


def test_threshold_filters_in_the_kernel_and_unwatched_processes_are_ignored() -> None:
    cpu = quietest_cpu()
    with sleeper(cpu) as watched, sleeper(cpu) as unwatched:
        low = run_probes(
            ["cstate"],
            together(watched, unwatched),
            watch=WatchSpec(pids={watched.pid}),
            thresholds={"cstate": {"wake": 0}},
        )
    assert low.of(IdleWake, tgid=watched.pid)
    assert low.of(IdleWake, tgid=unwatched.pid) == []

    with sleeper(cpu) as child, idle_log(cpu) as logged, sleep_log(child.pid) as slept:
        high = run_probes(
            ["cstate"],
            child.load,
            watch=WatchSpec(pids={child.pid}),
            thresholds={"cstate": {"wake": 10_000 * MS}},
            settle_s=1.2,
        )
        missed = untraced_switch_ins(logged(), child.pid) + unwoken_sleeps(slept(), child.pid)
    assert high.of(IdleWake) == []
    # Every sleep whose wake-up and switch back in the kernel traced (as the test above).
    assert sum(wake_counts(high).values()) >= 21 - missed


def test_idle_residency_agrees_with_the_kernels_idle_time() -> None:
    # The kernel's idle time per CPU, read every 5 ms while the probe runs; CPU 0 is kept
    # busy for part of the run so that its residency changes from one second to the next.
    readings: list[tuple[int, dict[int, int]]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            readings.append((time.monotonic_ns(), idle_ticks()))
            time.sleep(0.005)

    def load() -> None:
        time.sleep(1.2)
        with hog(0, "gj-hog"):
            time.sleep(1.5)
        time.sleep(1.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        rec = run_probes(["cstate"], load, watch=WatchSpec(pids={1}))
    finally:
        stop.set()
        sampler.join()

    def idle_at(ts_ns: int, cpu: int) -> float:
        """Kernel idle ns at ts_ns, interpolated between the readings around it."""
        for (t0, a), (t1, b) in itertools.pairwise(readings):
            if t0 <= ts_ns <= t1:
                frac = (ts_ns - t0) / (t1 - t0)
                return (a[cpu] + frac * (b[cpu] - a[cpu])) * 1e9 / USER_HZ
        raise AssertionError(f"no /proc/stat reading around {ts_ns}")

    full = [s for s in rec.of(CpuStats) if s.interval_ns > 900 * MS]
    assert len(full) >= 2 * 3  # three whole seconds on each of the two CPUs
    busy_seconds = 0
    for s in full:
        probe_ns = sum(ns for _, ns in s.idle_ns)
        kernel_ns = idle_at(s.ts_ns + s.interval_ns, s.cpu) - idle_at(s.ts_ns, s.cpu)
        assert probe_ns <= s.interval_ns
        # /proc/stat counts in 10 ms ticks: allow a tick at each end plus 3 %.
        assert probe_ns == pytest.approx(kernel_ns, abs=20 * MS + 0.03 * s.interval_ns)
        busy_seconds += s.cpu == 0 and probe_ns < 0.5 * s.interval_ns
    assert busy_seconds >= 1  # the hog's second on CPU 0 shows as (nearly) no idle time


def idle_within(log: list[Logged], t0_ns: int, t1_ns: int) -> int:
    """The logged CPU's idle-state time inside [t0_ns, t1_ns]: each entry to its exit (a stretch
    still open at the end of the log runs to t1_ns), clipped to the window."""
    total, entry = 0, None
    for e in log:
        if e.kind == "entry" and entry is None:
            entry = e.ts_ns
        elif e.kind == "exit" and entry is not None:
            total += max(0, min(e.ts_ns, t1_ns) - max(entry, t0_ns))
            entry = None
    if entry is not None:
        total += max(0, t1_ns - max(entry, t0_ns))
    return total


def bracketed(early: list[Logged], late: list[Logged]) -> list[tuple[Logged, Logged]]:
    """Each idle entry and exit in `early` (stamped by a program on cpu_idle that runs before
    the probe's) with its twin in `late` (one that runs after it): the first late event
    from then on, which comes before early's next (one CPU's next event waits for both
    programs); itself outside late's span (before its program was attached, after its read)."""
    late_ns = [e.ts_ns for e in late]
    pairs = []
    for i, e in enumerate(early):
        j = bisect.bisect_left(late_ns, e.ts_ns)
        if j < len(late) and (i + 1 == len(early) or late_ns[j] < early[i + 1].ts_ns):
            assert late[j].kind == e.kind, (e, late[j])
            pairs.append((e, late[j]))
        else:
            pairs.append((e, e))
    return pairs


def idle_bounds(early: list[Logged], late: list[Logged], t0_ns: int, t1_ns: int) -> tuple[int, int]:
    """The least and the most idle time inside [t0_ns, t1_ns] that a program on cpu_idle run
    between early's and late's can have stamped: each stretch from its entry's later stamp to
    its exit's earlier one, and from the earlier entry to the later exit (as idle_within)."""
    least = most = 0
    entry: tuple[int, int] | None = None
    for lo, hi in bracketed(early, late):
        if lo.kind == "entry" and entry is None:
            entry = (lo.ts_ns, hi.ts_ns)
        elif lo.kind == "exit" and entry is not None:
            least += max(0, min(lo.ts_ns, t1_ns) - max(entry[1], t0_ns))
            most += max(0, min(hi.ts_ns, t1_ns) - max(entry[0], t0_ns))
            entry = None
    if entry is not None:
        least += max(0, t1_ns - max(entry[1], t0_ns))
        most += max(0, t1_ns - max(entry[0], t0_ns))
    return least, most


def test_a_samples_idle_time_is_what_the_cpu_idled_within_its_interval() -> None:
    # The runner hands every probe the tick's time, read before the core's refresh and the
    # other probes' samples: cstate reads its counters later. Here 100 ms later, while the CPU
    # idles on and is then woken (this thread visits it) before the read: an idle stretch
    # straddles the tick and ends before the read. The next read follows at once. Each
    # sample must hold that CPU's idle time within its own interval (the raw log's), never
    # more than the interval: none of the late read's in the sample before it, none of the
    # prompt one's taken by the sample before. The log's programs on cpu_idle run before and
    # after the probe's, so that each of its stamps lies between theirs: a log's program
    # running next to it can lag its stamp by what the host takes between programs (a 300 ms
    # sample 131 us short of such a log's over 5 stretches, CI 2026-12-02; 3-6 us a stretch
    # short here, more the longer the stretch, 2026-12-02).
    cpu = quietest_cpu()
    home = os.sched_getaffinity(0)
    samples: list[CpuStats] = []
    late: list[tuple[int, int]] = []  # (tick, read) of each late read
    with (
        idle_log(cpu, IDLE_STAMPER) as stamped_before,
        ProbeSet(
            ["cstate"], topology=load_topology(), watch=WatchSpec(pids={1}), emit=list().append
        ) as probes,
    ):
        assert [s.state for s in probes.start()] == ["running"]
        (cstate,) = probes.probes
        with idle_log(cpu, IDLE_STAMPER) as stamped_after:
            cstate.sample(time.monotonic_ns())  # the first interval starts in the log
            for _ in range(4):
                time.sleep(0.2)
                tick_ns = time.monotonic_ns()
                time.sleep(0.1)
                os.sched_setaffinity(0, {cpu})  # the CPU leaves idle to run this thread
                os.sched_setaffinity(0, home)
                late.append((tick_ns, time.monotonic_ns()))
                for now_ns in (tick_ns, time.monotonic_ns()):
                    stats = cstate.sample(now_ns)
                    samples += [s for s in stats if isinstance(s, CpuStats) and s.cpu == cpu]
            after = stamped_after()
        before = stamped_before()
    # A precondition, not the probe: other work kept the CPU busy if this fails.
    assert sum(idle_within(after, t0, t1) for t0, t1 in late) > 10 * MS, f"CPU {cpu} seldom idled"
    assert len(samples) == 8
    for s in samples:
        idle_ns = sum(ns for _, ns in s.idle_ns)
        assert idle_ns <= s.interval_ns
        least_ns, most_ns = idle_bounds(before, after, s.ts_ns, s.ts_ns + s.interval_ns)
        assert least_ns - READ_SLACK_NS <= idle_ns <= most_ns + READ_SLACK_NS, (
            s,
            least_ns,
            most_ns,
        )


def test_beside_sched_one_program_per_scheduler_hook_and_each_stops_alone() -> None:
    # sched's programs run cstate's share of sched_switch and sched_waking: cstate loads only
    # its cpu_idle program, and still counts every wake-up. Stopped, cstate takes its share
    # out of sched's programs, and sched keeps following the watched thread.
    cpu = quietest_cpu()
    with ProbeSet(
        ["sched", "cstate"], topology=load_topology(), watch=WatchSpec(pids={1}), emit=list().append
    ) as probes:
        assert [s.state for s in probes.start()] == ["running", "running"]
        sched, cstate = probes.probes
        assert len(cstate.programs()) == 1
        for close_cstate in (False, True):
            with (
                sleeper(cpu) as child,
                idle_log(cpu) as logged,
                sleep_log(child.pid) as slept,
            ):
                probes.core.spec = WatchSpec(pids={child.pid})
                probes.core.refresh(time.monotonic_ns())
                child.load()
                untraced = untraced_switch_ins(logged(), child.pid)
                unwoken = unwoken_sleeps(slept(), child.pid)
            now = time.monotonic_ns()
            if not close_cstate:
                (hists,) = cstate.log2_maps()
                wakes = hists.delta(now)
                assert sum(n for h in wakes for _, n in h.buckets) >= 21 - untraced - unwoken
                cstate.close()
            else:
                totals = [t for t in sched.sample(now) if isinstance(t, ThreadSched)]
                assert sum(t.switches for t in totals if t.tid == child.pid) >= 21
