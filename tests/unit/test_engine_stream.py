"""Attribution engine over streams: the watermark and late events, determinism across runs and
interleavings, recorded-shape feeding loops with injected stalls, serialisation round trips,
bounded memory over long runs, and odd input."""

from __future__ import annotations

import itertools
import tracemalloc
from dataclasses import replace

import orjson
import pytest

from gpujitter.daemon.analysis.engine import Engine, EngineConfig
from gpujitter.daemon.analysis.records import Attribution
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import (
    IrqStolen,
    NodeTime,
    OffCpu,
    ProbeStatus,
    from_record,
    to_record,
)
from tests.conftest import cause_ns
from tests.fixtures.streams.feeding import FeedingLoop
from tests.fixtures.streams.synthetic import (
    CONFIG,
    MS,
    TWO_NODES,
    Stream,
    attribute_all,
    dur,
    evidence,
    ns,
    parts_ms,
)

SEC = 1000 * MS
PLAN = [
    *[("clean", 0)] * 5,
    ("swap", 20),
    ("clean", 0),
    ("contention", 15),
    ("irq", 10),
    ("faults", 12),
    ("compute", 25),
    ("cstate", 8),
    ("malloc", 9),
    ("migrate", 14),
    ("loader", 18),
    *[("clean", 0)] * 3,
]


def records(attrs: list[Attribution]) -> bytes:
    return b"\n".join(orjson.dumps(to_record(a)) for a in attrs)


# -- the watermark ------------------------------------------------------------------------


def test_a_gap_waits_for_the_watermark_and_takes_events_that_arrive_meanwhile():
    engine = Engine(TWO_NODES, CONFIG)
    (gap,) = Stream().gap(100, 140).events
    swap = Stream().offcpu(100, 130, state="uninterruptible").fault(100, 30, "swap", 1).events
    assert engine.feed(gap) == []
    # The swap-in's events come late (another source, a slow poll), the window a second on.
    assert [engine.feed(ev) for ev in swap] == [[], []]
    assert engine.feed(Stream().ran(0, 1000).events[0]) == []
    tick = ProbeStatus(ts_ns=ns(140) + CONFIG.lateness_ns - 1, probe="sched", state="running")
    assert engine.feed(tick) == []
    assert engine.stats().pending == 1
    (attr,) = engine.feed(replace(tick, ts_ns=ns(140) + CONFIG.lateness_ns))
    assert parts_ms(attr) == {"swap_in": 30, "host_work": 10}
    # Too late: counted, and the attribution already given stands.
    assert engine.feed(Stream().irq(100, 140, 36, "nvme0q1", 9, 9).events[0]) == []
    stats = engine.stats()
    assert (stats.late_events, stats.attributions, stats.pending) == (1, 1, 0)


def test_flush_attributes_every_gap_still_held():
    engine = Engine(TWO_NODES, CONFIG)
    for ev in Stream().ran(0, 1000).gap(100, 140).gap(200, 210, gpu=1).in_emission_order():
        assert engine.feed(ev) == []
    assert [(a.gpu, a.dur_ns) for a in engine.flush()] == [(0, 40 * MS), (1, 10 * MS)]
    assert engine.flush() == []


def test_too_many_pending_gaps_are_attributed_early_oldest_first():
    engine = Engine(TWO_NODES, replace(CONFIG, max_pending_gaps=2))
    gaps = Stream().gap(100, 110).gap(120, 130).gap(140, 150).events
    assert engine.feed(gaps[0]) == engine.feed(gaps[1]) == []
    (forced,) = engine.feed(gaps[2])
    assert forced.ts_ns == ns(100)
    assert (engine.stats().forced, engine.stats().pending) == (1, 2)


# -- determinism --------------------------------------------------------------------------


def test_the_same_stream_gives_byte_identical_records():
    loop = FeedingLoop(PLAN).build()
    first = records(list(attribute_all(loop.delivered(1), TWO_NODES, CONFIG)))
    second = records(list(attribute_all(loop.delivered(1), TWO_NODES, CONFIG)))
    assert first == second
    assert len(first) > 1000


def test_interleavings_that_keep_each_sources_order_give_identical_records():
    loop = FeedingLoop(PLAN).build()
    orders = [loop.delivered(seed) for seed in range(6)]
    assert len({tuple(id(ev) for ev in order) for order in orders}) == 6  # really different
    outputs = {records(list(attribute_all(order, TWO_NODES, CONFIG))) for order in orders}
    assert len(outputs) == 1


def test_records_do_not_depend_on_the_hash_seed():
    # Sets and dicts keyed by strings iterate in hash-seed order: run in fresh interpreters.
    import subprocess
    import sys

    code = (
        "from tests.fixtures.streams.feeding import FeedingLoop;"
        "from tests.unit.test_engine_stream import PLAN, records;"
        "from tests.fixtures.streams.synthetic import CONFIG, TWO_NODES, attribute_all;"
        "import hashlib;"
        "events = FeedingLoop(PLAN).build().delivered(3);"
        "out = records(list(attribute_all(events, TWO_NODES, CONFIG)));"
        "print(hashlib.sha256(out).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(digests) == 1


# -- a recorded-shape feeding loop ----------------------------------------------------------


def test_each_injected_stall_is_found_and_attributed_to_its_cause():
    loop = FeedingLoop(PLAN).build()
    attrs = list(attribute_all(loop.delivered(7), TWO_NODES, CONFIG))
    assert [(a.ts_ns, a.end_ns) for a in attrs] == [
        (t.gap_start_ns, t.gap_end_ns) for t in loop.truth
    ]
    for attr, truth in zip(attrs, loop.truth, strict=True):
        got = cause_ns(attr, truth.cause)
        assert abs(got - truth.cause_ns) <= truth.cause_ns * 2 // 100, (truth, parts_ms(attr))
        assert attr.top_cause == truth.cause, truth
        assert sum(p.ns for p in attr.parts) == attr.dur_ns
        # The blips below the sched threshold are all that stays unexplained: well under 2 %.
        assert cause_ns(attr, "unexplained") * 50 < attr.dur_ns, (truth, parts_ms(attr))


def test_the_loader_stall_is_credited_to_the_loader_thread_through_the_futex():
    loop = FeedingLoop([("clean", 0), ("loader", 18)]).build()
    (attr,) = attribute_all(loop.delivered(0), TWO_NODES, CONFIG)
    swap = next(p for p in attr.parts if p.cause == "swap_in")
    assert swap.tids == (202,)
    assert [(r.tid, r.role) for r in attr.threads] == [(201, "critical"), (202, "waker")]


# -- serialisation ------------------------------------------------------------------------


def test_a_trace_round_trip_of_every_input_kind_replays_to_the_same_records():
    loop = FeedingLoop(PLAN).build()
    events = loop.delivered(2)
    decoded = [from_record(orjson.loads(orjson.dumps(to_record(ev)))) for ev in events]
    assert decoded == events
    kinds = {type(ev).__name__ for ev in events}
    assert {"OffCpu", "IrqStolen", "MinorFaults", "NodeTime", "GpuGap", "CpuStats"} <= kinds
    assert records(list(attribute_all(decoded, TWO_NODES, CONFIG))) == records(
        list(attribute_all(events, TWO_NODES, CONFIG))
    )


def every_evidence_kind() -> list[Attribution]:
    s = Stream().migrate(50, 0, 2).migrate(60, 2, 0)
    s.offcpu(100, 104, state="uninterruptible").fault(100, 4, "swap", 0xAB000)
    s.offcpu(104, 106, state="uninterruptible").fault(104, 2, "file", 0xCD000)
    s.irq(106, 108, 36, "nvme0q1", 8, 1).minor(108, 110, 90, 1)
    s.offcpu(110, 114, runnable=112, cpu=2, cpu_in=1, other=77, other_comm="bash")
    s.alloc(115, 2).offcpu(118, 121, syscall=202).idle(121, 2)
    s.migrate(125, 0, 3).migrate(130, 3, 0)
    s.add(
        NodeTime(
            ts_ns=ns(0), interval_ns=SEC, tid=101, tgid=100, node_ns=((0, 900 * MS), (1, 60 * MS))
        )
    )
    return s.gap(100, 140).gap(0, 20, tid_after=0, tgids=()).attribute()


def test_attributions_round_trip_through_json_with_every_evidence_kind():
    attrs = every_evidence_kind()
    whats = {e.what for a in attrs for p in a.parts for e in p.evidence}
    assert whats == {
        "fault",
        "irq",
        "task",
        "migration",
        "idle",
        "alloc",
        "syscall",
        "node",
        "reason",
    }
    for attr in attrs:
        rec = orjson.loads(orjson.dumps(to_record(attr)))
        assert rec["type"] == "gpu.attribution"
        assert isinstance(rec["parts"][0], dict) and isinstance(rec["threads"], list)
        back = from_record(rec)
        assert back == attr
        assert hash(back) == hash(attr)
        assert orjson.dumps(to_record(back)) == orjson.dumps(to_record(attr))


def test_a_newer_minor_version_with_extra_fields_still_reads():
    (attr, _) = every_evidence_kind()
    rec = orjson.loads(orjson.dumps(to_record(attr)))
    rec["added_later"] = 1
    rec["parts"][0]["added_later"] = 2
    rec["parts"][0]["evidence"][0]["added_later"] = 3
    assert from_record(rec) == attr


# -- bounded memory -----------------------------------------------------------------------


def long_run(hours: float, threads: int, per_s: int, churn_every: int):
    """A steady synthetic load: per thread `per_s` off-CPU intervals, an IRQ window and an
    on-CPU window every second, a gap every 5 s; every `churn_every` simulated seconds the
    threads are replaced by new ones (new tids), as processes come and go over days."""
    for k in range(int(hours * 3600)):
        t0 = ns(k * 1000)
        tids = [10_000 + (k // churn_every) * threads + i for i in range(threads)]
        for tid in tids:
            for j in range(per_s):
                a = t0 + j * SEC // per_s
                yield OffCpu(a, a + 2 * MS, tid, 9, 0, 0, "sleeping", a + 2 * MS, syscall=202)
            yield IrqStolen(t0, t0 + SEC, tid, 9, 0, "hardirq", 36, "nvme0q1", 10, 2 * MS)
            yield NodeTime(t0, SEC, tid, 9, ((0, 800 * MS),))
        if k % 5 == 4:
            yield from Stream(tid=tids[0], tgid=9).gap(k * 1000, k * 1000 + 30).events


def test_memory_stays_bounded_by_age_over_a_long_run():
    retention_s = 20
    config = replace(CONFIG, retention_ns=retention_s * SEC, lateness_ns=2 * SEC)
    engine = Engine(TWO_NODES, config)
    # Four simulated hours (~115k events), a new pair of threads every minute. Memory is
    # traced over the last 40 minutes only (tracing every allocation is slow): what the engine
    # allocates there and still holds must stay flat once the retention has turned over.
    run = long_run(hours=4, threads=2, per_s=2, churn_every=60)
    shape = []
    for i, ev in enumerate(itertools.islice(run, 95_000)):
        engine.feed(ev)
        if i % 5_000 == 0:
            shape.append((engine.stats().spans, engine.stats().threads))
    held = []
    tracemalloc.start()
    try:
        for i, ev in enumerate(run):
            engine.feed(ev)
            if i % 2_000 == 0:
                held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    engine.flush()
    stats = engine.stats()
    assert stats.attributions == stats.gaps == 4 * 3600 // 5
    # Per thread and simulated second: 2 off-CPU spans with 2 place points each, 2 windows;
    # held for the retention, plus the eviction period and the entries a long span holds.
    bound = 2 * 2 * (retention_s + 2) * (2 * 3 + 2)
    assert max(spans for spans, _ in shape) <= bound, shape
    assert max(threads for _, threads in shape) <= 4, shape  # two generations at most
    assert len(held) >= 8
    assert max(held[1:]) - min(held[1:]) < 16_000, held  # flat: nothing grows with time
    assert stats.evicted > 80_000


def held(engine: Engine) -> int:
    """The entries the engine's timelines hold, counted in them (not its own count)."""
    return sum(tl.size for tl in engine._timelines.values())


def test_memory_stays_bounded_by_count_under_a_burst():
    config = replace(CONFIG, max_spans=5_000)
    engine = Engine(TWO_NODES, config)
    top = 0
    for i, ev in enumerate(long_run(hours=0.05, threads=20, per_s=25, churn_every=3600)):
        engine.feed(ev)  # 97k events
        top = max(top, engine.stats().spans)
        if i % 997 == 0:
            assert engine.stats().spans == held(engine), i
    assert top <= 5_000
    assert engine.stats().evicted > 90_000
    # What the count said was taken was taken: the timelines' count of entries of every
    # kind was lowered while the entries stayed (60 s of 4000 threads: 600k spans, 550 MB).
    assert engine.stats().spans == held(engine) <= 5_000


def test_a_crowd_of_threads_over_the_bound_leaves_the_feeding_threads_evidence() -> None:
    """A watched process of 4000 threads put the engine over its bound: the largest
    timelines gave up their entries first, the feeding thread's among them, and its stalls
    came out unexplained ("evicted"). Threads with CUDA calls now go last, the crowd first,
    and the eviction sorts once, not once per entry taken."""
    config = replace(CONFIG, max_spans=2_000)
    engine = Engine(TWO_NODES, config)
    feeder, crowd = Stream(), Stream()
    for i in range(300):  # a launch and a sleep every 10 ms for 3 s
        feeder.launch(10 * i).offcpu(10 * i + 2, 10 * i + 8)
    for i in range(6_000):  # 2,000 threads a second, one sleep each
        crowd.offcpu(i / 2, i / 2 + 0.1, tid=10_000 + i, comm="worker")
    events = sorted(feeder.events + crowd.events, key=lambda ev: ev.ts_ns)
    for ev in events:
        engine.feed(ev)
    assert held(engine) == engine.stats().spans <= 2_000 and engine.stats().evicted > 4_000
    # The crowd's threads not heard of within the lateness window (2 s: 4,000 of them) went
    # whole, not left as empty timelines until their retention (the daemon's memory grew so
    # by hundreds of MB beside a churning job).
    assert engine.stats().threads <= 4_000 + 1 + 100
    kept = engine._timelines[feeder.tid]
    assert len(kept.spans["offcpu"]) == len(kept.spans["cuda"]) == 300  # all of it
    assert len(kept.places) == 900  # where it ran, too


def test_a_thread_dropped_whole_by_count_comes_back_knowing_what_was_evicted() -> None:
    """40 threads of one sleep each, all heard within the lateness window, over a bound of
    40: the count passes empty some timelines and drop them whole. One that comes back must
    say its evicted sleep was evicted, not that no data was ever there."""
    engine = Engine(TWO_NODES, replace(CONFIG, max_spans=40))
    crowd = Stream(tid=300, tgid=100)
    for k in range(40):
        crowd.offcpu(k, k + 0.5, tid=300 + k)
    for ev in crowd.events:
        engine.feed(ev)
    assert 301 not in engine._timelines  # dropped whole, its sleep at 1 ms with it
    back = Stream(tid=301, tgid=100).offcpu(100, 101, tid=301).gap(1, 1.5, tid_after=301)
    for ev in back.events:
        engine.feed(ev)
    (attribution,) = engine.flush()
    assert [(p.cause, [getattr(e, "reason", None) for e in p.evidence])
            for p in attribution.parts] == [("unexplained", ["evicted"])]  # fmt: skip


def test_a_thread_of_one_span_costs_its_span_not_a_list_of_every_kind() -> None:
    """A job starting 500 threads a second: each thread's timeline held an empty list of
    every kind of span (3 KB before its first span), 30k of them in the retention, 100 MB."""
    engine = Engine(TWO_NODES, CONFIG)
    crowd = Stream()
    for i in range(5_000):
        crowd.offcpu(i / 100, i / 100 + 0.001, tid=10_000 + i, comm="worker")
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for ev in crowd.events:
            engine.feed(ev)
        per_thread = (tracemalloc.get_traced_memory()[0] - before) / 5_000
    finally:
        tracemalloc.stop()
    assert engine.stats().threads == 5_000
    assert per_thread < 2_000, per_thread  # 1.6 KB, the event itself (~400 B) included


def test_a_gap_older_than_the_retained_history_says_so():
    s = Stream().ran(0, 1000).ran(1000, 2000).ran(2000, 3000).ran(3000, 4000)
    config = replace(CONFIG, retention_ns=2 * SEC, lateness_ns=SEC, evict_every_ns=0)
    engine = Engine(TWO_NODES, config)
    for ev in s.in_emission_order():
        engine.feed(ev)
    (gap,) = Stream().gap(500, 3500).events
    (attr,) = [*engine.feed(gap), *engine.flush()]
    # At 4 s, with 2 s kept, the window [0, 1) s is gone: [0.5, 1) s of the gap is unknown.
    assert parts_ms(attr) == {"host_work": 2500, "unexplained": 500}
    assert evidence(attr, "unexplained")[0].reason == "evicted"


# -- odd input ----------------------------------------------------------------------------


def test_odd_input_degrades_instead_of_crashing():
    s = Stream()
    s.add(OffCpu(ns(120), ns(110), 101, 100, 0, 0, "sleeping", ns(500)))  # ends before it starts
    s.add(OffCpu(ns(100), ns(105), 101, 100, 0, 0, "preempted", ns(50)))  # runnable before ts
    s.add(IrqStolen(ns(100), ns(90), 101, 100, 0, "hardirq", 99, "x", 3, -5))  # negative total
    s.add(OffCpu(ns(100), ns(130), 0, 0, 0, 0, "sleeping", ns(130)))  # tid 0: not a thread
    s.add(ProbeStatus(ts_ns=ns(1), probe="new-probe", state="running", reason="from the future"))
    s.ran(0, 1000).gap(100, 140).gap(150, 150).gap(170, 160)
    attrs = s.attribute()
    assert [sum(p.ns for p in a.parts) for a in attrs] == [40 * MS, 0, 0]
    assert parts_ms(attrs[0]) == {"host_work": 35, "runq_wait": 5}


def test_config_errors_are_one_line_errors():
    with pytest.raises(GpujitterError, match="lateness_ns must not be negative"):
        EngineConfig(lateness_ns=-1)
    with pytest.raises(GpujitterError, match="retention must be at least the lateness"):
        EngineConfig(retention_ns=dur(10), lateness_ns=dur(20))
    with pytest.raises(GpujitterError, match="max_spans must be at least 1"):
        EngineConfig(max_spans=0)


def test_the_whole_analysis_levels_off_at_many_gaps_per_second():
    """Issue 10: the daemon's memory grew ~0.33 MB/s at ~100 gaps/s over 36 s, and whether
    it levels off was unknown. Gap detector, engine and node state together, fed a stall
    every other step (~40 gaps a second) for 100 s of stream time: what they hold stops
    growing once the detector's history and the engine's retention (here 10 s each; 60 s by
    default, which is the warm-up the daemon's memory shows) are full."""
    from gpujitter.daemon.analysis.gaps import GapConfig
    from gpujitter.daemon.analysis.pipeline import AnalysisConfig, Pipeline
    from gpujitter.daemon.service.state import NodeState

    plan = [("contention", 12.0) if i % 2 == 0 else ("clean", 0.0) for i in range(5_000)]
    stream = FeedingLoop(plan).build().delivered(seed=3)
    ten_s = 10 * 10**9
    config = AnalysisConfig(
        gaps=GapConfig(history_ns=ten_s), engine=EngineConfig(retention_ns=ten_s)
    )
    pipeline = Pipeline(TWO_NODES, config)
    state = NodeState(TWO_NODES)
    # Only what the analysis allocated counts: other tests' threads may still be running.
    mine = [tracemalloc.Filter(True, "*/daemon/*")]
    held: list[tuple[float, int]] = []
    tracemalloc.start()
    try:
        for i, ev in enumerate(stream):
            state.observe(ev)
            for out in pipeline.feed(ev):
                state.observe(out)
            if i % 1_000 == 0:
                traced = tracemalloc.take_snapshot().filter_traces(mine).statistics("filename")
                at_s = (ev.ts_ns - stream[0].ts_ns) / 1e9
                held.append((at_s, sum(stat.size for stat in traced)))
    finally:
        tracemalloc.stop()
    after_warm_up = [b for s, b in held if s > 25]
    assert held[-1][0] > 55 and len(after_warm_up) >= 8
    assert state.events > 0 and len(state.attributions) == state.attributions.maxlen
    assert max(after_warm_up) - min(after_warm_up) < 200_000, held  # flat, not 0.33 MB/s
