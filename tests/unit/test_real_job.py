"""The real training job's scoring and tables (bench/real_job.py, bench/real_job_table.py):
daemon logs written by the daemon's own log writer, read back and scored as the drills
score, against the job's step log and stall records."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.real_job import attributions, clean_window, cost_summary, read_steps, scenario_score
from bench.real_job_table import tables
from gpujitter.daemon.analysis.records import Attribution, FrameEvidence, Part
from gpujitter.daemon.sinks.jsonlog import JsonLog

MS = 1_000_000
S = 1_000 * MS


def gap(start_ms: float, end_ms: float, **parts_ms: float) -> Attribution:
    parts = tuple(
        Part(c, round(ms * MS)) for c, ms in sorted(parts_ms.items(), key=lambda p: -p[1])
    )
    return Attribution(
        ts_ns=round(start_ms * MS), end_ns=round(end_ms * MS), gpu=0, sources=("cuda",),
        resolution_ns=50_000, confidence=0.9, parts=parts,
    )  # fmt: skip


def write_log(path: Path, attrs: list[Attribution]) -> Path:
    log = JsonLog(path)
    for a in attrs:
        log.write(a)
    log.close()
    return path


def write_steps(path: Path, idle_after_ms: dict[int, float]) -> Path:
    """50 ms steps from t=1 s for 10 s; the GPU idles `idle_after_ms[n]` after step n."""
    t = 1 * S
    lines = []
    for n in range(200):
        t0, tf = t, t + MS // 5
        t1 = t0 + 50 * MS
        lines.append(f"{n + 1} {t0} {tf} {t1}")
        t = t1 + round(idle_after_ms.get(n, 0.1) * MS)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_clean_window_counts_every_gap_as_false_and_says_which_the_job_really_had(
    tmp_path: Path,
) -> None:
    # after step 41 the job waits 12 ms for its batch, after step 101 4.5 ms (4.3 + the
    # 0.2 ms from a step's start to its batch in hand)
    steps = read_steps(write_steps(tmp_path / "steps.tsv", {40: 12.0, 100: 4.3}))
    idle_start_ms = (steps[40][2]) / MS
    short_start_ms = (steps[100][2]) / MS
    log = write_log(tmp_path / "attach-1.jsonl", [
        gap(6_000, 6_080, host_work=80),  # nothing there but a step's 0.3 ms: false
        gap(idle_start_ms, idle_start_ms + 12, blocked=12),  # the job's own 12 ms idle
        # the job's 4.5 ms from the sync's return to its batch, seen by the GPU as 5.1 ms
        gap(short_start_ms - 0.2, short_start_ms + 4.9, host_work=5.1),
        gap(20_000, 20_050, host_work=50),  # after the window
    ])  # fmt: skip
    got = clean_window(attributions(log), steps, 2 * S, 10 * S)
    assert (got["false_gaps"], got["false_on_job_idle"], got["job_idle_5ms"]) == (3, 2, 1)
    assert got["window_s"] == 8.0 and got["steps"]["steps"] > 100
    assert got["steps"]["median_ms"] == 50.0


def test_a_scenario_is_scored_as_a_drill_with_its_false_gaps(tmp_path: Path) -> None:
    spec = {"name": "sleep", "cause": "blocked", "truth": "the stall", "where": "after_sync",
            "start_ns": 1 * S, "stall_ms": 30.0}  # fmt: skip
    stalls = [{"scenario": "sleep", "index": k, "t0_ns": (2 + k) * S,
               "t1_ns": (2 + k) * S + 30 * MS, "cause_ns": 30 * MS} for k in range(3)]  # fmt: skip
    log = write_log(tmp_path / "attach-6.jsonl", [
        gap(2_000, 2_030.2, blocked=29, host_work=1.2),
        gap(3_000, 3_030.1, blocked=30.1),
        gap(4_000, 4_030.3, host_work=20, blocked=10.3),  # top cause wrong
        gap(4_500, 4_510, host_work=10),  # overlaps no stall: false
        gap(4_990, 5_110, blocked=120),  # holds the injector's teardown (swapoff): apart
    ])  # fmt: skip
    steps = read_steps(write_steps(tmp_path / "steps.tsv", {70: 8.0}))
    idle = [gap(steps[70][2] / MS - 0.3, steps[70][2] / MS + 8.4, host_work=8.7)]  # the job's
    got = scenario_score(spec, stalls, 5 * S, attributions(log), steps)
    assert (got["found"], got["top_right"], got["false_gaps"]) == (3, 2, 1)
    assert got["teardown_gaps"] == [{"ms": 120.0, "top_cause": "blocked"}]
    assert got["attributed_ms"] == 69.4 and got["truth_ms"] == 90.0
    assert got["targets"] == {"found_all": True, "no_false_gaps": False, "top_cause": False,
                              "attributed": False, "no_self_inflicted": True}  # fmt: skip
    # a gap on idle the job measured itself is counted apart and misses no target
    both = scenario_score(spec, stalls, 5 * S, attributions(log) + idle, steps)
    assert (both["false_gaps"], both["false_on_job_idle"]) == (2, 1)
    assert not both["targets"]["no_false_gaps"]
    alone = [a for a in attributions(log) if a.ts_ns != 4_500 * MS] + idle
    only_job = scenario_score(spec, stalls, 5 * S, alone, steps)
    assert (only_job["false_gaps"], only_job["false_on_job_idle"]) == (1, 1)
    assert only_job["targets"]["no_false_gaps"]
    assert "| 1 (1 on the job's own idle) |" in "\n".join(
        tables({"mode": "accuracy", "attaches": [], "scenarios": [only_job]})
    )
    failed = {"scenario": "swap", "error": "no swap"}
    summary = {"mode": "accuracy", "notes": ["a note"], "attaches": [], "scenarios": [got, failed]}
    text = "\n".join(tables(summary))
    assert "| sleep | 3/3 (30.0 ms each) | blocked: 2/3 (top: blocked, host_work) |" in text
    assert "| swap | not run: no swap |" in text and "- a note" in text


def test_a_python_function_named_by_the_stalls_is_scored_as_host_works_top_frame(
    tmp_path: Path,
) -> None:
    """pyhot: a gap counts as named when its host work's top frame is the stalls' function
    (frames tied for the top alike); gaps whose host work is shorter than a sampling period
    are not scored."""
    spec = {"name": "pyhot", "cause": "host_work", "truth": "the stall", "where": "after_sync",
            "start_ns": 1 * S, "stall_ms": 30.0}  # fmt: skip
    hot = ("pyhot_step", "/x/injectors.py", 640)
    stalls = [{"scenario": "pyhot", "index": k, "t0_ns": (2 + k) * S,
               "t1_ns": (2 + k) * S + 30 * MS, "cause_ns": 30 * MS,
               "func": hot[0], "file": hot[1], "line": hot[2]} for k in range(5)]  # fmt: skip

    other = ("other", "/x/y.py", 3)

    def hot_gap(
        start_ms: float, host_ms: float, *named: tuple[tuple[str, str, int], int]
    ) -> Attribution:
        """A gap of host work whose frames (function, samples) are listed heaviest first."""
        frames = tuple(FrameEvidence(*where, samples=n, of=3, ns=n * 10 * MS) for where, n in named)
        a = gap(start_ms, start_ms + host_ms, host_work=host_ms)
        return replace(a, parts=(Part("host_work", round(host_ms * MS), (7,), frames),))

    log = write_log(tmp_path / "attach-6.jsonl", [
        hot_gap(2_000, 30, (hot, 2), (other, 1)),
        hot_gap(3_000, 30, (other, 2), (hot, 1)),  # not the top frame
        hot_gap(4_000, 30, (other, 1), (hot, 1)),  # tied for the top: named
        hot_gap(5_000, 30),  # no sample at all
        hot_gap(6_000, 2, (other, 1)),  # under a period: not scored
    ])  # fmt: skip
    got = scenario_score(spec, stalls, 7 * S, attributions(log), [])
    assert got["frames"] == {"gaps": 4, "named": 2}
    text = "\n".join(tables({"mode": "accuracy", "attaches": [], "scenarios": [got]}))
    assert "pyhot: the injected function is host work's top frame in 2 of 4 gaps" in text
    sleep = scenario_score({**spec, "name": "sleep"}, [{k: v for k, v in s.items()
                            if k not in ("func", "file", "line")} for s in stalls],
                           6 * S, attributions(log), [])  # fmt: skip
    assert "frames" not in sleep


def test_cost_is_the_median_paired_difference_and_rounds_without_steps_are_left_out() -> None:
    def half(ms: float, cpu: float | None = None) -> dict[str, Any]:
        got: dict[str, Any] = {"steps": 600, "median_ms": ms}
        if cpu is not None:
            got.update(daemon={"cpu_pct": cpu, "rss_mb": 180.0 + cpu}, false_gaps=0)
        return got

    rounds = [
        {"round": 1, "off": half(50.0), "on": half(50.5, 2.0)},
        {"round": 2, "off": half(51.0), "on": half(51.0, 3.0)},
        {"round": 3, "off": half(50.0), "on": half(50.1, 1.0)},
        {"round": 4, "off": {"steps": 0}, "on": half(99.0, 9.0)},
    ]
    c = cost_summary(rounds)
    assert c["rounds"] == 3 and c["cost_pct"] == 0.2 and c["cost_pct_range"] == [0.0, 1.0]
    assert (c["off_ms"], c["on_ms"], c["daemon_cpu_pct"], c["daemon_rss_mb"]) == (
        50.0, 50.5, 2.5, 189.0)  # fmt: skip
    text = "\n".join(tables({"mode": "cost", "rounds": rounds, "cost": c, "round_s": 30,
                             "attaches": []}))  # fmt: skip
    assert "| 3 × 30 s | 50.00 ms | 50.50 ms | +0.20 % (+0.00 to +1.00) | 2.5 % of a CPU |" in text
    assert "| 189 MB | 0 |\n" in text
    rounds[1]["on"].update(false_gaps=2, false_on_job_idle=1)
    text = "\n".join(tables({"mode": "cost", "rounds": rounds, "cost": c, "round_s": 30,
                             "attaches": []}))  # fmt: skip
    assert "| 189 MB | 2 (1 on the job's own idle) |" in text


def test_a_log_that_was_never_written_has_no_attributions(tmp_path: Path) -> None:
    assert attributions(tmp_path / "none.jsonl") == []
