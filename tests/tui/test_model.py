"""The model and the decoding of stream records: what each view reads after the fixed node
stream, CPU halves merged and aged, placements judged, bad input counted not raised."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC
from typing import Any

import pytest

from gpujitter.daemon.analysis.describe import evidence_line
from gpujitter.daemon.analysis.records import (
    Attribution,
    CauseTime,
    GpuGap,
    IdleEvidence,
    IrqEvidence,
    MigrationEvidence,
    Part,
    TaskEvidence,
    ThreadRole,
)
from gpujitter.probes.events import to_record
from gpujitter.tui import decode
from gpujitter.tui.inbox import Connection
from gpujitter.tui.model import GAP_LIMIT, IGNORED_KEYS, NodeModel
from gpujitter.tui.text import WallClock
from gpujitter.tui.views.breakdown import breakdown_text
from gpujitter.tui.views.gaps import GapsTable
from gpujitter.tui.views.status import status_text
from gpujitter.tui.views.timeline import bars, cause_bar, columns, gap_marks
from tests.tui import node_stream

S = 1_000_000_000
MS = 1_000_000
US = 1_000


@pytest.fixture(scope="module")
def records() -> list[dict[str, Any]]:
    return node_stream.stream()


@pytest.fixture(scope="module")
def model(records: list[dict[str, Any]]) -> NodeModel:
    m = NodeModel(WallClock(tz=UTC))
    m.apply_all(records)
    return m


def test_gaps_newest_first_with_their_attribution_and_top_cause(
    model: NodeModel, records: list[dict[str, Any]]
) -> None:
    rows = model.gaps_newest_first()
    sent = node_stream.gaps_newest_first(records)
    assert [g.gap_id for g, _ in rows] == [node_stream.gap_id(g) for g in sent]
    newest, pending = rows[0]
    assert pending is None and newest.dur_ns == sent[0]["end_ns"] - sent[0]["ts_ns"]
    row, rec = node_stream.first_gap_with(records, "alloc_stall")
    gap, a = rows[row]
    assert a is not None and a.top is not None
    top = max(rec["parts"], key=lambda p: p["ns"])
    share = round(top["ns"] / (rec["end_ns"] - rec["ts_ns"]), 3)
    assert (a.top.cause, a.top.ns, round(a.share(a.top), 3)) == ("alloc_stall", top["ns"], share)
    assert sum(p.ns for p in a.parts) == gap.dur_ns
    assert a.remedies == tuple(rec["remedies"]) and a.remedies
    assert model.clock.time(gap.ts_ns) == node_stream.wall(rec["ts_ns"])


def test_cpu_rows_merge_the_irq_and_idle_halves_and_flag_remote_placement(
    model: NodeModel, records: list[dict[str, Any]]
) -> None:
    rows = {r.cpu: r for r in model.cpu_rows()}
    assert sorted(rows) == list(range(8)) and [rows[c].node for c in range(8)] == [0] * 4 + [1] * 4
    busy = rows[node_stream.IRQ_BUSY_CPU]
    stats = [r for r in records if r["type"] == "cpu.stats" and r["cpu"] == busy.cpu]
    irq = [r for r in stats if not r["idle_ns"]][-1]  # the irq probe's half
    idle = [r for r in stats if r["idle_ns"]][-1]  # the cstate probe's
    assert busy.hardirq == pytest.approx((irq["hardirq_ns"] + irq["vector_ns"]) / S)
    assert busy.top_irqs[0][0] == "nvme0q3" and busy.remote_irqs[0][0] == "nvme0q3"
    assert dict(busy.idle)["C1"] == pytest.approx(dict(idle["idle_ns"])["C1"] / S)
    placed = {t.tid: remote for row in rows.values() for t, remote in row.threads}
    # GPU 0's feeding thread runs on its GPU's node; GPU 1's rank, feeding thread and
    # loader, on node 0, away from GPU 1 (node 1).
    assert placed == {
        node_stream.thread(0): False,
        node_stream.thread(1): True,
        node_stream.thread(1, loader=True): True,
    }


def test_interrupt_figures_age_out_after_quiet_windows_but_idle_ones_stay() -> None:
    m = NodeModel()
    m.apply({"type": "cpu.stats", "ts_ns": 0, "interval_ns": S, "cpu": 0, "hardirq_ns": S // 2})
    m.apply({"type": "cpu.stats", "ts_ns": 0, "interval_ns": S, "cpu": 0, "idle_ns": [["C1", S]]})
    assert m.cpu_rows()[0].hardirq == 0.5
    m.apply({"type": "daemon.status", "ts_ns": 5 * S})  # time moves on; the irq probe is quiet
    row = m.cpu_rows()[0]
    assert row.hardirq == 0.0 and row.idle == (("C1", 1.0),)


def test_status_counts_probes_lost_events_and_drops(
    model: NodeModel, records: list[dict[str, Any]]
) -> None:
    latest = {r["probe"]: r for r in records if r["type"] == "meta.probe"}
    assert {p.probe: p.state for p in model.probes.values()}["cstate"] == "degraded"
    lost = sum(p["lost_kernel"] + p["lost_user"] for p in latest.values())
    assert lost and model.lost_events() == lost
    text = status_text(model, None, None, inbox_dropped=5, paused=False).plain
    assert f"lost {lost}" in text and "dropped 5" in text and "daemon cpu" in text
    states = Counter(p["state"] for p in latest.values())
    assert f"{states['running']} on" in text and f"{states['degraded']} degr" in text
    assert f"{states['unavailable']} unavail" in text and f"{states['off']} off" in text
    model.apply({"type": "dropped", "count": 7, "total": 7})
    assert "dropped 12" in status_text(model, None, None, inbox_dropped=5, paused=True).plain


def test_status_line_shows_the_probes_bpf_cost_once_measured(model: NodeModel) -> None:
    assert "bpf " not in status_text(model, None, None, inbox_dropped=0, paused=False).plain
    for probe, ns in (("sched", 2_000_000), ("irq", 500_000)):
        model.apply({"type": "meta.probe", "ts_ns": 1, "probe": probe, "state": "running",
                     "bpf_ns_per_s": ns, "bpf_runs_per_s": 1000})  # fmt: skip
    text = status_text(model, None, None, inbox_dropped=0, paused=False).plain
    assert "bpf 0.25% (sched 0.20%)" in text


def test_status_line_counts_the_core_s_bpf_cost_and_marks_a_sampled_one() -> None:
    """The core module's programs are in the total (its meta.probe `core`), though the core
    is no probe in the count; a figure from a sampled second (statistics off) reads `~`."""
    m = NodeModel()

    def costs(cost_from: str) -> str:
        for probe, ns in (("sched", 2_000_000), ("core", 1_000_000)):
            m.apply({"type": "meta.probe", "ts_ns": 1, "probe": probe, "state": "running",
                     "bpf_ns_per_s": ns, "bpf_runs_per_s": 1000,
                     "cost_from": cost_from})  # fmt: skip
        return status_text(m, None, None, inbox_dropped=0, paused=False).plain

    sampled = costs("sampled")
    assert "bpf ~0.30% (sched 0.20%)" in sampled and "probes 1 on" in sampled
    assert "bpf 0.30% (sched 0.20%)" in costs("bpf_stats")


def test_unknown_and_malformed_records_are_counted_not_raised() -> None:
    m = NodeModel()
    m.apply({"type": "gpu.frobnicate", "ts_ns": 1})
    m.apply({"type": "gpu.sample", "ts_ns": 1, "gpu": 0})  # no metric, no value
    m.apply({"no": "type"})
    assert m.ignored == {"gpu.frobnicate": 1, "gpu.sample (malformed)": 1, "None": 1}


def test_only_the_newest_gaps_are_kept() -> None:
    m = NodeModel()
    for n in range(GAP_LIMIT + 10):
        m.apply(to_record(gap(n * S, n * S + MS)))
    assert len(m.gaps) == GAP_LIMIT and min(g.ts_ns for g in m.gaps.values()) == 10 * S


def test_evidence_lines_per_kind() -> None:
    start = 100 * MS
    lines = [
        evidence_line(e, start)
        for e in [
            IrqEvidence(irq_kind="hardirq", irq=36, name="nvme0q3", cpus=(2, 3), count=4,
                        ns=2 * MS, device_node=1, remote_to_gpu=True),
            TaskEvidence(tid=0, comm="", cpus=(1,), count=1, ns=MS),
            MigrationEvidence(at_ns=start + 3 * MS, tid=7, src_cpu=1, dst_cpu=5, src_node=0,
                              dst_node=1),
            IdleEvidence(state=3, state_name="C6", cpus=(4,), count=2, ns=300_000,
                         exit_latency_ns=133_000),
        ]
    ]  # fmt: skip
    assert lines == [
        "hardirq 36 nvme0q3 on CPUs 2,3: 4× 2.00ms (device on node 1, remote to the GPU)",
        "waited behind an idle CPU or an unknown task on CPU 1: 1× 1.00ms",
        "tid 7 migrated CPU 1 → 5 (node 0 → 1) at +3.00ms",
        "woken from C6 on CPU 4: 2× 300.0us (exit latency 133.0us)",
    ]


def test_attributions_are_the_engines_records_checked_as_every_reader_checks_them() -> None:
    rec = to_record(attribution(parts=(Part("irq", 4), Part("blocked", 6))))
    a = decode.attribution({**rec, "future_field": {"x": 1}})  # a newer minor's field: dropped
    assert isinstance(a, Attribution)
    assert [p.cause for p in a.parts] == ["blocked", "irq"]  # largest first
    assert (a.gap.gap_id, a.tid, a.gpu_node, a.remedies) == ("1:0", 0, -1, ())
    m = NodeModel()
    m.apply({k: v for k, v in rec.items() if k != "sources"})  # a required field missing
    m.apply({**rec, "parts": [{"cause": "irq", "ns": "4"}]})  # a field of the wrong type
    assert m.attributions == {} and m.ignored == {"gpu.attribution (malformed)": 2}


def test_timeline_columns_gap_marks_and_the_cause_bar() -> None:
    samples = [(t * S, 100.0 if t % 2 else 0.0, S) for t in range(1, 11)]
    assert columns(samples, 0, 10 * S, 5) == [50.0, 50.0, 50.0, 50.0, 50.0]
    assert columns([], 0, S, 3) == [None, None, None]
    marks, n = gap_marks([(2 * S, 3 * S, "irq"), (20 * S, 21 * S, None)], 0, 10 * S, 10)
    assert n == 1 and marks.plain == "··━·······"
    parts = [("swap_in", 66), ("irq", 33), ("blocked", 1)]
    bar = cause_bar(parts, 10)
    assert len(bar.plain) == 10 and [s.end - s.start for s in bar.spans] == [7, 3]


def test_the_breakdown_shows_where_a_followed_wait_went_in_the_waker() -> None:
    own = (CauseTime("host_work", 36 * MS), CauseTime("runq_wait", MS))
    worker = ThreadRole(tid=301, tgid=300, comm="pt_data_worker", role="waker", ns=38 * MS,
                        top_cause="host_work", hops=3, woke=302, causes=own)  # fmt: skip
    a = decode.attribution(to_record(attribution(
        end_ns=40 * MS, gpu=0, tid=101, tgid=100, threads=(worker,),
        parts=(Part("host_work", 40 * MS, tids=(301,)),))))  # fmt: skip
    (t,) = a.threads
    assert (t.hops, t.woke, t.causes) == (3, 302, worker.causes)
    text = breakdown_text(a.gap, a, WallClock(tz=UTC), 60).plain
    assert "waker    pt_data_worker  tid 301 pid 300  38.00ms  woke tid 302, 3 hops" in text
    assert "host work 36.00ms, run-queue wait 1.00ms" in text


def test_a_gap_on_no_known_gpu_reads_as_such() -> None:
    """GPU -1 is 'no GPU known' (no NVML): the breakdown and the Gaps view's GPU column say
    '?', as the GPUs view does, never the sentinel."""
    text = breakdown_text(gap(0, 5 * MS, gpu=-1), None, WallClock(tz=UTC), 60).plain
    assert text.startswith("GPU ? idle 5.00ms") and "-1" not in text
    cells = GapsTable(NodeModel(WallClock(tz=UTC))).row_cells(gap(0, 5 * MS, gpu=-1), None)
    assert cells[1].plain == "?"


def sample(value: object) -> dict[str, Any]:
    return {"type": "gpu.sample", "ts_ns": S, "gpu": 0, "metric": "util", "value": value,
            "period_ns": 100 * MS}  # fmt: skip


def test_a_sample_that_is_no_finite_number_is_refused_and_bars_stay_in_range() -> None:
    """float() reads "nan" and "inf" from a string; such a sample is malformed, not drawn
    (int(nan) in the bars ended the app). A value outside 0..top draws at the edge."""
    m = NodeModel()
    for value in ("nan", "inf", "-inf"):
        m.apply(sample(value))
    m.apply(sample(42))
    assert [v for _, v, _ in m.series(0, "util")] == [42.0]
    assert m.ignored == {"gpu.sample (malformed)": 3}
    assert bars([-50.0, 0.0, 100.0, 250.0], 100.0, "").plain == "▁▁██"
    # finite samples whose column sums past any float (two of 1e308): drawn at the edge,
    # where int(inf) ended the app (the TUI audit's recording)
    m.apply(sample(1e308))
    m.apply(sample(1e308))
    summed = columns(m.series(0, "util"), 0, 10 * S, 1)
    assert bars(summed, 100.0, "").plain == "█"
    assert bars([float("-inf"), float("nan")], 100.0, "").plain == "▁▁"


def test_live_values_that_cannot_be_measurements_are_refused_as_malformed() -> None:
    """Negative counts and durations, a gap that ends before it starts, a BPF cost above
    every CPU of a large node: refused, so no view shows them as measured. A probe state a
    newer daemon knows is counted as "other"."""
    m = NodeModel()
    m.apply({"type": "dropped", "count": -100, "total": -5})
    m.apply({"type": "daemon.status", "ts_ns": S, "cpu_percent": -5})
    m.apply(to_record(gap(2 * S, S)))
    m.apply(to_record(attribution(ts_ns=2 * S, end_ns=S)))
    m.apply({"type": "meta.probe", "ts_ns": S, "probe": "irq", "state": "running",
             "bpf_ns_per_s": 10**18})  # fmt: skip
    m.apply({"type": "meta.probe", "ts_ns": S, "probe": "sched", "state": "running",
             "lost_kernel": -1})  # fmt: skip
    m.apply({"type": "cpu.stats", "ts_ns": S, "interval_ns": S, "cpu": 3,
             "hardirq_ns": -(10**18)})  # fmt: skip
    # a resolution, a part or a thread's time below zero, a confidence outside 0..1
    m.apply(to_record(replace(gap(2 * S, 3 * S), resolution_ns=-5)))
    m.apply(to_record(replace(gap(2 * S, 3 * S), confidence=-3.0)))
    m.apply(to_record(attribution(ts_ns=2 * S, end_ns=3 * S, parts=(Part("swap_in", -S),))))
    m.apply(to_record(attribution(ts_ns=2 * S, end_ns=3 * S, confidence=1.5)))
    m.apply(to_record(attribution(ts_ns=2 * S, end_ns=3 * S, threads=(
        ThreadRole(tid=1, tgid=1, comm="t", role="waker", ns=5, hops=-1),))))  # fmt: skip
    assert m.daemon_dropped == 0 and m.status is None and not m.gaps and not m.probes
    assert not m.cpus and not m.attributions
    assert m.ignored == {"dropped (malformed)": 1, "daemon.status (malformed)": 1,
                         "gpu.gap (malformed)": 3, "gpu.attribution (malformed)": 4,
                         "meta.probe (malformed)": 2, "cpu.stats (malformed)": 1}  # fmt: skip
    m.apply({"type": "meta.probe", "ts_ns": S, "probe": "irq", "state": "paused"})
    m.apply({"type": "meta.probe", "ts_ns": S, "probe": "sched", "state": "running"})
    text = status_text(m, None, None, inbox_dropped=0, paused=False).plain
    assert "probes 1 on 1 other" in text


def test_evidence_of_an_unknown_kind_keeps_its_attribution_and_shows_its_fields() -> None:
    """docs/schema.md: a client ignores what it does not know; docs/tui.md: unknown evidence
    is shown as its fields. A newer daemon's kind of evidence must not cost the gap its
    whole attribution."""
    rec = to_record(attribution(parts=(Part("irq", 4), Part("blocked", 6))))
    rec["parts"][0]["evidence"] = [{"what": "nvlink", "ns": 5, "link": [3, 4], "name": "\x1b[2J"}]
    m = NodeModel()
    m.apply(rec)
    a = m.attributions["1:0"]
    assert [p.cause for p in a.parts] == ["blocked", "irq"] and not m.ignored
    text = breakdown_text(a.gap, a, WallClock(tz=UTC), 60).plain
    assert "nvlink, ns 5, link [3,4], name \\x1b[2J" in text
    rec["parts"][0]["evidence"] = [{"what": "irq", "ns": "5"}]  # a known kind, ill-typed
    m.apply(rec)
    assert m.ignored == {"gpu.attribution (malformed)": 1}


def test_records_not_shown_are_counted_in_the_status_line_under_bounded_keys() -> None:
    """Unknown types, malformed records and the daemon's error lines are counted by why, at
    most IGNORED_KEYS distinct whys (error messages are free text), and the status line says
    how many were skipped, with the feed's unreadable lines."""
    m = NodeModel()
    assert "skipped" not in status_text(m, None, None, inbox_dropped=0, paused=False).plain
    for n in range(IGNORED_KEYS * 3):
        m.apply({"type": "error", "message": f"bad request {n}"})
    assert len(m.ignored) == IGNORED_KEYS and sum(m.ignored.values()) == IGNORED_KEYS * 3
    assert m.ignored["other"] == IGNORED_KEYS * 2 + 1
    text = status_text(m, None, None, inbox_dropped=0, paused=False, bad_lines=4).plain
    assert f"skipped {IGNORED_KEYS * 3 + 4}" in text


def test_the_status_line_says_why_it_waits_what_the_client_sees_and_a_silent_daemon() -> None:
    m = NodeModel()
    m.apply({"type": "hello", "pid": 2301, "scope": "uid 1000"})
    waiting = Connection("waiting", "daemon refused: too many clients, retrying")
    text = status_text(m, waiting, None, inbox_dropped=0, paused=False).plain
    assert text.startswith("○ daemon refused: too many clients, retrying │ scope uid 1000 │")
    connected = Connection("connected")
    live = status_text(m, connected, None, inbox_dropped=0, paused=False, silent_s=1.2).plain
    assert live.startswith("● daemon pid 2301 │")
    quiet = status_text(m, connected, None, inbox_dropped=0, paused=False, silent_s=7.4).plain
    assert quiet.startswith("● daemon pid 2301 (silent 7 s) │")


def gap(ts_ns: int, end_ns: int, gpu: int = 0) -> GpuGap:
    return GpuGap(ts_ns=ts_ns, end_ns=end_ns, gpu=gpu, sources=("cuda",), resolution_ns=US,
                  confidence=0.9)  # fmt: skip


def attribution(**fields: Any) -> Attribution:
    """An attribution as the engine makes one (gap [0, 10 ns] on GPU 1 unless told)."""
    base: dict[str, Any] = {"ts_ns": 0, "end_ns": 10, "gpu": 1, "sources": ("cuda",),
                            "resolution_ns": US, "confidence": 0.9, "parts": ()}  # fmt: skip
    return Attribution(**{**base, **fields})


def test_an_idle_total_fits_its_column_whatever_its_size() -> None:
    """Printed as ms, 100 s of idle in the window took 8 columns of the 7, and the panel's
    idle row wrapped (the time axis fell out of the box; compact, the total was not shown)."""
    from gpujitter.tui.views.gpus import VALUE, _total

    totals = [40_000, 5 * MS, 9_999 * MS, 10 * S, 200 * S, 999 * S, 5_000 * S, 10**18]
    shown = [_total(ns) for ns in totals]
    assert shown[:5] == ["0.04ms", "5.00ms", "9999ms", "10.0s", "200.0s"]
    assert all(len(t) < VALUE for t in shown), shown


def test_a_wall_clock_set_during_the_run_moves_the_times_shown() -> None:
    """A meta.clock record (the daemon's clock was set), or the snapshot's `clock` for a
    client that connects after that, replaces the hello's reference."""
    hello = {"type": "hello", "clock": {"type": "meta.clock", "ts_ns": S, "realtime_ns": 100 * S}}
    stepped = {"type": "meta.clock", "ts_ns": 2 * S, "realtime_ns": 101 * S + 3_600 * S}
    for late in (False, True):
        m = NodeModel(WallClock(tz=UTC))
        m.apply(hello)
        assert m.clock.wall_ns(5 * S) == 104 * S
        m.apply({"type": "snapshot", "ts_ns": 3 * S, "clock": stepped} if late else stepped)
        assert m.clock.wall_ns(5 * S) == 104 * S + 3_600 * S
