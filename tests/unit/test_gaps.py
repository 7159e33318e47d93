"""The gap detector is a pure function of the event stream. Replayed here on the event trace
of the GPU proof run on the H200 (tests/fixtures/gaps/: libcuda uprobe events and NVML samples
in the order the live detector saw them, and what the workload really did): every injected
stall is found within 2 ms, nothing inside the clean stretches, the same gaps however the
stream is fed. Rules the trace does not exercise (several processes on one GPU, a process
NVML lists late, no NVML at all) are checked on small streams built around it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import orjson
import pytest

from gpujitter.cli import main
from gpujitter.daemon.analysis.gaps import SWEEP_EVERY_NS, UNKNOWN_GPU, GapConfig, GapDetector
from gpujitter.daemon.analysis.pipeline import AnalysisConfig, analyse
from gpujitter.daemon.analysis.records import Attribution, GpuGap
from gpujitter.daemon.sinks.trace import TraceReader
from gpujitter.probes.events import (
    CudaCall,
    Event,
    GpuProcesses,
    GpuSample,
    OffCpu,
    ThreadExit,
    from_record,
)
from tests.conftest import FIXTURES
from tests.fixtures.streams.synthetic import detect

EVENTS = FIXTURES / "gaps" / "h200-proof-events.ndjson"
# A drill's torch loop on the H200, 1 s before to 1.5 s after it started feeding, with no
# stall: board power dipped to mid-swing for 80 ms while the loop kept syncing on 10 ms of
# matmuls (its uprobe events and NVML samples as recorded).
POWER_DIP = FIXTURES / "gaps" / "h200-power-dip-events.ndjson"
POWER_DIP_GO_NS = 404_994_328_971
TRUTH = FIXTURES / "gaps" / "h200-proof-truth.json"
MS = 1_000_000


@pytest.fixture(scope="module")
def stream() -> list[Event]:
    return [from_record(orjson.loads(line)) for line in EVENTS.read_bytes().splitlines()]


@pytest.fixture(scope="module")
def truth() -> list[dict]:
    return list(json.loads(TRUTH.read_text()))


def test_injected_stalls_are_found_within_2ms_and_clean_stretches_stay_clean(
    stream: list[Event], truth: list[dict]
) -> None:
    gaps = detect(stream)
    stalls = [t for t in truth if t["cmd"] in ("stall", "idle")]
    clean = [t for t in truth if t["cmd"] in ("clean", "busy")]
    assert len(stalls) == 12 and len(clean) == 14
    for t in stalls:
        (gap,) = [g for g in gaps if g.ts_ns < t["t1"] and t["t0"] < g.end_ns]
        assert abs(gap.ts_ns - t["t0"]) <= 2 * MS, t
        assert abs(gap.end_ns - t["t1"]) <= 2 * MS, t
        assert gap.sources[0] == "cuda" and gap.gpu == 0
        assert gap.tid_before == gap.tid_after == gap.tgids[0]  # the loop's one thread
        assert gap.confidence >= 0.9
        if t["t1"] - t["t0"] >= 100 * MS:  # several 20 ms power samples inside
            assert "power" in gap.sources, t
    for t in clean:
        assert not [g for g in gaps if g.ts_ns < t["t1"] - MS and t["t0"] + MS < g.end_ns], t
    assert len(gaps) == len(stalls)


def test_same_gaps_from_every_detector(stream: list[Event]) -> None:
    whole = detect(stream)
    assert whole and detect(stream) == whole  # nothing carries over between detectors


def test_replay_command_prints_the_detectors_gaps(
    stream: list[Event], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gaps", "--replay-events", str(EVENTS), "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = detect(stream)
    assert [(p["ts_ns"], p["end_ns"], tuple(p["sources"])) for p in printed] == [
        (g.ts_ns, g.end_ns, g.sources) for g in expected
    ]


def test_min_gap_is_configurable(stream: list[Event], truth: list[dict]) -> None:
    gaps = detect(stream, GapDetector(GapConfig(min_gap_ns=30 * MS)))
    long_stalls = [t for t in truth if t["cmd"] in ("stall", "idle") and t["arg"] != "cpu20"]
    assert len(gaps) == len(long_stalls)  # the 20 ms CPU-bound steps drop out


def clean_stretch(truth: list[dict]) -> tuple[int, int, int]:
    """A clean 400 ms stretch of the proof run and the workload's process id."""
    t = next(t for t in truth if t["cmd"] == "clean")
    return t["t0"], t["t1"], 0


def quiet_launch(tgid: int, start: int, end: int, prev_api: str) -> CudaCall:
    return CudaCall(
        ts_ns=end,
        dur_ns=0,
        tid=tgid,
        tgid=tgid,
        cpu=0,
        api="launch",
        func="cuLaunchKernel",
        after_idle_ns=end - start,
        prev_tid=tgid,
        prev_api=prev_api,
    )


def with_event(stream: list[Event], ev: Event) -> list[Event]:
    """`ev` inserted where the live stream would have carried it (after its timestamp)."""
    at = next(i for i, e in enumerate(stream) if e.ts_ns > ev.ts_ns + 50 * MS)
    return [*stream[:at], ev, *stream[at:]]


def workload_pid(stream: list[Event]) -> int:
    return next(e.pids[0] for e in stream if isinstance(e, GpuProcesses) and e.pids)


def test_host_quiet_while_power_says_busy(stream: list[Event], truth: list[dict]) -> None:
    # A made-up 100 ms quiet stretch inside a real clean stretch, where the H200's power
    # samples show the GPU busy throughout.
    t0, _, _ = clean_stretch(truth)
    pid = workload_pid(stream)
    start, end = t0 + 100 * MS, t0 + 200 * MS
    after_launch = detect(with_event(stream, quiet_launch(pid, start, end, "launch")))
    assert not [g for g in after_launch if g.ts_ns == start]  # queued work may have run
    after_sync = detect(with_event(stream, quiet_launch(pid, start, end, "sync")))
    (gap,) = [g for g in after_sync if g.ts_ns == start]
    assert gap.confidence == 0.4  # drained, yet busy: a feeder the tracer does not see


def test_without_nvml_host_side_gaps_stand_alone(stream: list[Event], truth: list[dict]) -> None:
    host_only = [e for e in stream if not isinstance(e, GpuSample | GpuProcesses)]
    gaps = detect(host_only)
    assert gaps and all(g.gpu == UNKNOWN_GPU and g.sources == ("cuda",) for g in gaps)
    for t in (t for t in truth if t["cmd"] in ("stall", "idle")):
        (gap,) = [g for g in gaps if g.ts_ns < t["t1"] and t["t0"] < g.end_ns]
        assert gap.confidence == 0.9  # it followed a sync: the queue had drained
    # Quiet stretches that began at a launch (the GPU may have run queued work) are kept
    # when nothing else can judge them, at low confidence; NVML dropped all of them above.
    assert {g.confidence for g in gaps} == {0.9, 0.3}


def test_without_nvml_no_gap_waits_for_power_that_will_not_come(stream: list[Event]) -> None:
    """Deciding the first gap keeps a state under UNKNOWN_GPU; the node must not look as if
    NVML were there from then on: no later gap waits the settle time for a power sample.
    Those that begin at a sync's return wait for its verdict, no more."""
    host_only = [e for e in stream if not isinstance(e, GpuSample | GpuProcesses)]
    config = GapConfig()
    detector = GapDetector(config)
    lags = [detector.now_ns - gap.end_ns for ev in host_only for gap in detector.feed(ev)]
    # decided at the event that ended them, or once their sync was judged (the stream's
    # next event after that: 1.6 s at most here); all but the first waited 3.0-4.0 s before
    assert len(lags) > 5 and lags.count(0) > len(lags) // 2
    assert max(lags) < config.settle_ns


def test_a_gap_needs_every_feeder_of_the_gpu_quiet(stream: list[Event], truth: list[dict]) -> None:
    # A second process on the GPU, quiet only over the second half of a real stall: the GPU
    # was idle only where both were.
    pid = workload_pid(stream)
    stall = next(t for t in truth if t["cmd"] == "stall" and t["arg"] == "sleep50")
    other = pid + 1
    mid = (stall["t0"] + stall["t1"]) // 2
    events = [
        dataclasses.replace(e, pids=(pid, other)) if isinstance(e, GpuProcesses) else e
        for e in stream
    ]
    # It fed the GPU a second before (a traced call), then went quiet halfway through.
    before = stall["t0"] - 1_000 * MS
    events = with_event(events, quiet_launch(other, before - 2 * MS, before, "sync"))
    events = with_event(events, quiet_launch(other, mid, stall["t1"] + 5 * MS, "sync"))
    (gap,) = [g for g in detect(events) if g.ts_ns < stall["t1"] and stall["t0"] < g.end_ns]
    assert gap.ts_ns == mid
    assert abs(gap.end_ns - stall["t1"]) <= 2 * MS  # where the workload launched again
    assert gap.tgids == (pid, other)
    # The last thread active before the gap was the other process's, the first after it
    # the workload's.
    assert (gap.tid_before, gap.tid_after) == (other, pid)


def test_power_dips_while_syncs_wait_on_the_gpu_are_no_gap() -> None:
    dip = [from_record(orjson.loads(line)) for line in POWER_DIP.read_bytes().splitlines()]
    assert not [g for g in detect(dip) if g.end_ns > POWER_DIP_GO_NS]
    # Without the syncs (a feeder the tracer cannot see), the same samples are a power gap.
    unseen = [e for e in dip if not isinstance(e, CudaCall)]
    (gap,) = detect(unseen)
    assert gap.sources == ("power",) and 60 * MS < gap.end_ns - gap.ts_ns < 100 * MS


# -- a daemon attached to a GPU already busy (issue 11): power alone proves nothing until the
# detector knows, from evidence, what this GPU's idle power is.


def nvml_only(events: list[Event], attached_ns: int) -> list[Event]:
    """What a detector started at `attached_ns` sees of a recording, without the traced
    calls (a feeder the tracer does not see, or whose syncs are too short to prove it busy)."""
    return [e for e in events if e.ts_ns >= attached_ns and not isinstance(e, CudaCall)]


def test_attached_under_a_busy_gpu_power_dips_are_no_gap() -> None:
    # Attached 100 ms into the drill's loop: the GPU never idled since, and its 80 ms dip
    # from ~720 W to ~490 W lies below the midpoint of the lowest and highest power seen.
    dip = [from_record(orjson.loads(line)) for line in POWER_DIP.read_bytes().splitlines()]
    assert detect(nvml_only(dip, POWER_DIP_GO_NS + 100 * MS)) == []


def busy_before_idles(truth: list[dict], index: int) -> int:
    """100 ms into the `index`th busy 1.5 s stretch of the proof run."""
    return [t for t in truth if t["cmd"] == "busy"][index]["t0"] + 100 * MS


def test_once_the_gpu_idled_real_gaps_are_found_by_power_alone(
    stream: list[Event], truth: list[dict]
) -> None:
    # Attached under load; 1.4 s later the workload idles 1.5 s (utilisation reads 0 %),
    # which shows the detector this GPU's idle power: the later stalls are found in power.
    gaps = detect(nvml_only(stream, busy_before_idles(truth, 2)))
    later = [t for t in truth if t["cmd"] == "stall" and t["arg"] == "faults"]
    idle = next(t for t in truth if t["cmd"] == "idle" and t["t0"] > busy_before_idles(truth, 2))
    for t in [idle, *later]:
        (gap,) = [g for g in gaps if g.ts_ns < t["t1"] and t["t0"] < g.end_ns]
        assert abs(gap.ts_ns - t["t0"]) <= 60 * MS and abs(gap.end_ns - t["t1"]) <= 60 * MS, t
    assert {g.sources for g in gaps} == {("util",), ("power",)}


def test_a_floor_kept_from_a_previous_run_lets_power_find_real_gaps(
    stream: list[Event], truth: list[dict]
) -> None:
    # Restarted under load after the GPU's last idle: the stalls that follow (sleeps and page
    # fault storms, the GPU really idle) show only in power.
    restart = busy_before_idles(truth, 3)
    previous = GapDetector()
    detect([e for e in stream if e.ts_ns < restart], previous)
    floors = previous.idle_floors()
    assert list(floors) == [0] and 110 < floors[0] < 130  # the H200's idle board power
    assert detect(nvml_only(stream, restart)) == []  # not claimed unproven
    gaps = detect(nvml_only(stream, restart), GapDetector(idle_floors=floors))
    # The same gaps as a detector that ran all along.
    always = detect(nvml_only(stream, 0))
    assert gaps == [g for g in always if g.ts_ns >= restart] and len(gaps) == 5
    for gap in gaps:
        assert gap.sources == ("power",)
        assert any(t["cmd"] == "stall" and t["t0"] < gap.end_ns and gap.ts_ns < t["t1"]
                   for t in truth)  # fmt: skip


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("power_min_samples", 0, "power_min_samples must be at least 1"),
        ("power_idle_fraction", 1.5, "power_idle_fraction must be between 0 and 1"),
        ("min_gap_ns", -1, "min_gap_ns must not be negative"),
        ("max_offcpu_per_thread", 0, "max_offcpu_per_thread must be at least 1"),
        ("offcpu_settle_ns", -1, "offcpu_settle_ns must not be negative"),
    ],
)
def test_settings_the_detector_cannot_work_with_are_refused(
    setting: str, value: float, said: str
) -> None:
    """A trace header carries these settings into `report`: power_min_samples 0 once ended in
    an IndexError inside the detector."""
    from gpujitter.daemon.analysis.pipeline import AnalysisConfig
    from gpujitter.errors import GpujitterError

    rec = AnalysisConfig().to_record()
    rec["gaps"][setting] = value
    with pytest.raises(GpujitterError, match=said):
        AnalysisConfig.from_record(rec)


@pytest.mark.parametrize(
    ("part", "setting", "value", "said"),
    [
        ("engine", "remedy_min_pct", -1, "remedy_min_pct must be from 0 to 100"),
        ("engine", "remedy_min_pct", 1 << 63, "remedy_min_pct must be from 0 to 100"),
        ("engine", "max_addresses", -1, "max_addresses must not be negative"),
        ("idle_floors_w", "0", -1e308, "GPU 0: -1e\\+308 W is no board's idle"),
        ("idle_floors_w", "0", float("nan"), "GPU 0: nan W is no board's idle"),
    ],
)
def test_engine_settings_and_idle_floors_out_of_range_are_refused(
    part: str, setting: str, value: float, said: str
) -> None:
    """A trace header made by hand (or damaged) said a negative share or a board's idle power
    of -1e308 W, taken as given where every other setting is range-checked."""
    from gpujitter.daemon.analysis.pipeline import AnalysisConfig
    from gpujitter.errors import GpujitterError

    rec = AnalysisConfig().to_record()
    rec[part][setting] = value
    with pytest.raises(GpujitterError, match=said):
        AnalysisConfig.from_record(rec)


def test_a_header_written_before_a_setting_replays_as_its_daemon_ran() -> None:
    """offcpu_unsynced_ns came with a behaviour (a thread that never synced keeps 5 s of its
    off-CPU intervals, not the history): a header without it is an older daemon's, which
    kept them for the whole history; a header with it says what its daemon used."""
    from gpujitter.daemon.offline.recordings import open_recording

    rec = AnalysisConfig().to_record()
    rec["gaps"]["history_ns"] = 30_000_000_000
    assert AnalysisConfig.from_record(rec).gaps.offcpu_unsynced_ns == 5_000_000_000
    del rec["gaps"]["offcpu_unsynced_ns"]
    assert AnalysisConfig.from_record(rec).gaps.offcpu_unsynced_ns == 30_000_000_000
    del rec["gaps"]["history_ns"]
    assert AnalysisConfig.from_record(rec).gaps.offcpu_unsynced_ns == 60_000_000_000
    older = open_recording([FIXTURES / "gaps" / "h200-realjob-sync.gjtrace"]).header.analysis
    assert "offcpu_unsynced_ns" not in older["gaps"]  # recorded before the setting
    config = AnalysisConfig.from_record(older).gaps
    assert config.offcpu_unsynced_ns == config.history_ns


@pytest.mark.parametrize("history_ns", [0, 1])
def test_a_history_shorter_than_the_waits_it_keeps(history_ns: int) -> None:
    """A header's history_ns of 0 or 1 (valid values) ended the replay of a real recording
    in an IndexError: a thread whose kept run-queue waits had all aged out at once."""
    from gpujitter.daemon.analysis.pipeline import Pipeline
    from gpujitter.daemon.offline.recordings import open_recording

    rec = open_recording([FIXTURES / "gaps" / "h200-realjob-sync.gjtrace"])
    record = AnalysisConfig.from_record(rec.header.analysis).to_record()
    record["gaps"]["history_ns"] = history_ns
    pipeline = Pipeline(rec.header.topology, AnalysisConfig.from_record(record))
    out = [e for ev in rec for e in pipeline.feed(ev)] + pipeline.flush()
    assert any(isinstance(e, GpuGap) for e in out)


# -- starved inside a synchronisation (issue 11): a sync covers GPU work only while work is
# queued; a thread runnable inside it after the GPU drained is the stall itself.

# Recorded by `gpujitter drill sync-contention --keep-trace` on the development VM (stub
# libcuda, whose sync sleeps in poll() on a timerfd armed for the drain): a SCHED_FIFO hog
# took the feeder's CPU 3 ms before the queue drained, while the feeder slept in
# cuStreamSynchronize, and held it ~25 ms past the drain. Truth: when the stub's queue
# drained and when the sync returned, as the loop measured them.
SYNC_CONTENTION = FIXTURES / "gaps" / "stub-sync-contention.gjtrace"
SYNC_CONTENTION_TRUTH = FIXTURES / "gaps" / "stub-sync-contention-truth.json"


def replay_trace(path: Path) -> tuple[list[Event], list[Event]]:
    """The trace's events and what the pipeline makes of them (as `gpujitter report`)."""
    with TraceReader(path) as trace:
        header, events = trace.header, list(trace)
    return events, list(
        analyse(events, header.topology, AnalysisConfig.from_record(header.analysis))
    )


def test_a_feeder_starved_inside_a_sync_is_a_gap_from_its_wake_up_caused_by_the_run_queue() -> None:
    truth = json.loads(SYNC_CONTENTION_TRUTH.read_text())
    _, found = replay_trace(SYNC_CONTENTION)
    gaps = [e for e in found if isinstance(e, GpuGap)]
    attributions = [e for e in found if isinstance(e, Attribution)]
    assert len(truth["stalls"]) == 3 and len(gaps) == len(attributions) == 3
    for stall in truth["stalls"]:
        (gap,) = [g for g in gaps if g.ts_ns < stall["t1_ns"] and stall["t0_ns"] < g.end_ns]
        # It starts at the wake-up (the timerfd firing at the drain) and ends at the sync's
        # return, a few µs before the loop read its clock.
        assert abs(gap.ts_ns - stall["t0_ns"]) <= 200_000, stall
        assert abs(gap.end_ns - stall["t1_ns"]) <= 200_000, stall
        assert gap.sources == ("cuda", "sched") and gap.confidence == 0.9
        (attr,) = [a for a in attributions if a.ts_ns == gap.ts_ns]
        assert attr.top_cause == "runq_wait"
        runq = next(p for p in attr.parts if p.cause == "runq_wait")
        assert abs(runq.ns - stall["cause_ns"]) <= 0.05 * stall["cause_ns"], stall


def test_the_starved_gap_waits_for_the_off_cpu_intervals_however_the_rings_interleave() -> None:
    # The sync comes from the cuda ring, the wake-up from the sched ring: either may be read
    # first. Moving every off-CPU interval after the next 20 events gives the same gaps.
    events, _ = replay_trace(SYNC_CONTENTION)
    late = []
    for i, ev in enumerate(events):
        late.append((i + 20 if isinstance(ev, OffCpu) else i, i, ev))
    reordered = [ev for _, _, ev in sorted(late, key=lambda t: (t[0], t[1]))]
    assert detect(reordered) == detect(events)
    assert len(detect(events)) == 3


def test_a_threads_exit_read_before_its_last_syncs_record_keeps_what_the_sync_reads() -> None:
    # The exit comes through the core's ring, the sync's record through the cuda ring: an
    # exit read first (here, one before each stalled sync's record) must not take the
    # off-CPU intervals inside that sync with it.
    events, _ = replay_trace(SYNC_CONTENTION)
    gaps = detect(events)
    ends = {g.end_ns for g in gaps}  # a starved gap ends at its sync's return
    exits_first: list[Event] = []
    for ev in events:
        if isinstance(ev, CudaCall) and ev.api == "sync" and ev.ts_ns + ev.dur_ns in ends:
            exits_first.append(ThreadExit(ts_ns=ev.ts_ns + ev.dur_ns, tgid=ev.tgid, tid=ev.tid))
        exits_first.append(ev)
    assert len(exits_first) == len(events) + 3
    assert detect(exits_first) == gaps


def at_the_samplers_cadence(stream: list[Event]) -> list[Event]:
    """A stream the sampler read every 500 ms, as its cadence now delivers it (utilisation
    and the processes every 2 s): each poll's utilisation samples (a poll emits them before
    its power samples) held back to the fourth poll, every other process list left out."""
    polls: list[int] = []  # where each poll's samples begin in the stream
    poll_of: dict[int, int] = {}
    last = None
    for i, ev in enumerate(stream):
        if isinstance(ev, GpuSample):
            if ev.metric == "util" and last != "util":
                polls.append(i)
            poll_of[i] = len(polls) - 1
            last = ev.metric
    held: dict[int, list[Event]] = {}
    out: list[Event] = []
    procs = 0
    for i, ev in enumerate(stream):
        out += held.pop(i, [])
        if isinstance(ev, GpuProcesses):
            procs += 1
            if procs % 2 == 0:
                continue
        if isinstance(ev, GpuSample) and ev.metric == "util" and poll_of[i] % 4 != 3:
            due = poll_of[i] + 3 - poll_of[i] % 4
            held.setdefault(polls[due] if due < len(polls) else len(stream), []).append(ev)
            continue
        out.append(ev)
    return out + held.pop(len(stream), [])


def test_nvml_read_at_the_samplers_cadence_gives_the_same_gaps(stream: list[Event]) -> None:
    """Utilisation samples arriving up to 2 s after their window (not 0.5 s), and process
    lists every 2 s: the proof run's gaps, those a 0 % utilisation window corroborates
    among them, come out the same."""
    later = at_the_samplers_cadence(stream)
    assert later != stream
    gaps = detect(stream)
    assert detect(later) == gaps
    assert [g for g in gaps if "util" in g.sources]


def spinning_sync_preempted(power_w: list[float]) -> list[Event]:
    """A thread spinning in a 300 ms sync (as PyTorch's default schedule does), preempted
    from 40 ms until just before the sync returned (it saw the drain as soon as it ran
    again); one power sample per 20 ms from 0 (watts as given)."""
    pid = 7
    events: list[Event] = [GpuProcesses(ts_ns=0, gpu=0, pids=(pid,))]
    events += [
        GpuSample(ts_ns=k * 20 * MS, gpu=0, metric="power", value=w, period_ns=20 * MS)
        for k, w in enumerate(power_w)
    ]
    events.append(
        OffCpu(ts_ns=40 * MS, end_ns=300 * MS - 200_000, tid=pid, tgid=pid, cpu=1, cpu_in=1,
               state="preempted", runnable_ns=40 * MS, other_tid=99, other_comm="hog")
    )  # fmt: skip
    events.append(
        CudaCall(ts_ns=0, dur_ns=300 * MS, tid=pid, tgid=pid, cpu=1, api="sync",
                 func="cuStreamSynchronize", prev_tid=pid, prev_api="launch")
    )  # fmt: skip
    return sorted(events, key=lambda e: e.ts_ns)


def test_a_spinning_sync_preempted_while_power_falls_idle_is_a_gap_placed_by_power() -> None:
    # The H200 case of issue 11: a hog preempted the training thread spinning in a sync for
    # ~290 ms; the GPU drained and idled ~250 ms. Power places the drain inside the preemption.
    watts = [700.0] * 3 + [120.0] * 12 + [700.0] * 3  # idle from 60 ms to 300 ms
    (gap,) = detect(spinning_sync_preempted(watts), GapDetector(idle_floors={0: 115.0}))
    assert (gap.ts_ns, gap.end_ns) == (60 * MS, 300 * MS)
    assert gap.sources == ("cuda", "sched", "power") and gap.resolution_ns == 20 * MS
    # Busy all along (the hog ran while the queue still held work): no gap.
    busy = detect(spinning_sync_preempted([700.0] * 18), GapDetector(idle_floors={0: 115.0}))
    assert busy == []


def short_lived_feeder(pid: int, start_ns: int) -> list[Event]:
    """A process that feeds the GPU for one second and exits: a 10 ms compute step and a sync
    every 20 ms, each step launched after the sync's return (a quiet stretch), and a thread
    of it preempted on the way."""
    events: list[Event] = []
    for k in range(50):
        t = start_ns + k * 20 * MS
        events.append(
            CudaCall(ts_ns=t, dur_ns=0, tid=pid, tgid=pid, cpu=0, api="launch",
                     func="cuLaunchKernel", after_idle_ns=2 * MS, prev_tid=pid, prev_api="sync")
        )  # fmt: skip
        events.append(
            OffCpu(ts_ns=t + MS, end_ns=t + 2 * MS, tid=pid, tgid=pid, cpu=0, cpu_in=0,
                   state="preempted", runnable_ns=t + MS, other_tid=99, other_comm="hog")
        )  # fmt: skip
        events.append(
            CudaCall(ts_ns=t + 8 * MS, dur_ns=10 * MS, tid=pid, tgid=pid, cpu=0, api="sync",
                     func="cuStreamSynchronize", prev_tid=pid, prev_api="launch")
        )  # fmt: skip
    return events


def held_by(detector: GapDetector) -> int:
    """Entries the detector keeps per process or thread."""
    per_process = (detector.last_call, detector.quiet, detector.busy, detector.offcpu)
    return sum(len(table) for table in per_process) + sum(
        len(kept) for table in (detector.quiet, detector.busy, detector.offcpu)
        for kept in table.values()
    )  # fmt: skip


def test_what_exited_feeders_leave_behind_goes_after_the_history() -> None:
    # The soak's daemon grew while its feeding loop restarted every two minutes: each
    # process's last minute of long syncs stayed, since only its own next sync pruned them.
    # One feeding process a second for 10 minutes (stream time): what is held stays what
    # one history's worth of them made.
    detector = GapDetector()
    held = []
    for n in range(600):
        for ev in short_lived_feeder(1000 + n, n * 1_000 * MS):
            detector.feed(ev)
        held.append(held_by(detector))
    history_s = detector.config.history_ns // (1_000 * MS)
    assert max(held[2 * history_s :]) <= max(held[: 2 * history_s]) * 1.1
    assert len(detector.busy) <= history_s + 2


def churning_threads(exits: bool, seconds: int = 30) -> GapDetector:
    """A watched process that never syncs and starts 100 short threads a second, each
    preempted 10 times (run-queue waits worth keeping) before it exits; every other exit is
    read before the thread's intervals (the core's ring drained before the sched ring)."""
    detector = GapDetector()
    for k in range(seconds * 100):
        t = k * 10 * MS
        tid = 2000 + k
        exit_ev = ThreadExit(ts_ns=t + 9 * MS, tgid=1999, tid=tid)
        if exits and k % 2:
            detector.feed(exit_ev)
        for i in range(10):
            detector.feed(
                OffCpu(ts_ns=t + i * 200_000, end_ns=t + i * 200_000 + 150_000, tid=tid,
                       tgid=1999, cpu=0, cpu_in=0, state="preempted",
                       runnable_ns=t + i * 200_000, other_tid=99, other_comm="hog")
            )  # fmt: skip
        if exits and not k % 2:
            detector.feed(exit_ev)
    return detector


def test_an_exited_threads_intervals_go_soon_after_its_exit() -> None:
    # A job churning threads kept each one's last intervals for the whole history.
    cfg = GapConfig()
    kept = churning_threads(exits=True)
    exited_lately = (cfg.offcpu_unsynced_ns + SWEEP_EVERY_NS) // (10 * MS) + 1
    assert len(kept.offcpu) <= exited_lately
    assert len(churning_threads(exits=False).offcpu) == 3000  # without exits: all of them
    # The latest to exit keep theirs (a sync's record read after the exit reads them).
    assert len(kept.offcpu[2000 + 2999]) == 10


def test_a_reused_tid_keeps_the_new_threads_intervals() -> None:
    detector = GapDetector()
    wait = dict(tgid=1999, cpu=0, cpu_in=0, state="preempted", other_tid=99, other_comm="hog")
    detector.feed(OffCpu(ts_ns=0, end_ns=100_000, tid=7, runnable_ns=0, **wait))
    detector.feed(ThreadExit(ts_ns=MS, tgid=1999, tid=7))
    # the tid again, a new thread of the same process, before the exit's intervals go
    detector.feed(OffCpu(ts_ns=2 * MS, end_ns=2 * MS + 100_000, tid=7, runnable_ns=2 * MS, **wait))
    for s in range(1, 8):  # stream time moves on past the exit's delay (another thread)
        detector.feed(OffCpu(ts_ns=s * 1_000 * MS, end_ns=s * 1_000 * MS + 100_000, tid=8,
                             runnable_ns=s * 1_000 * MS, **wait))  # fmt: skip
    assert [o.ts_ns for o in detector.offcpu[7].by_time] == [2 * MS]
