"""bench/default_set.py's hook floor: each of the set's programs maps to the hook it runs on,
one empty program per program (the kernel runs every attached program of a hook), and the
programs whose hook the function name does not give are listed, not dropped silently."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.default_set import hook_floor, mirror_hooks

# Program names as the bench reads them (probe:function), from a dev VM run's kernel figures.
RAN = [
    "sched:sched__raw_tracepoint__sched_switch",
    "cstate:cstate__raw_tracepoint__cpu_idle",
    "irq:irq__raw_tracepoint__irq_handler_entry",
    "sched:sched__tracepoint__sched__sched_migrate_task",
    "faults:faults__tracepoint__filemap__mm_filemap_fault",
    "irq:irq__raw_tracepoint__call_function_single_entry",
    "faults:on_major_done",
    "malloc:malloc__raw_tracepoint__mmap_lock_start_locking",
]


def test_each_program_maps_to_its_hook() -> None:
    hooks, left = mirror_hooks(RAN)
    assert hooks == [
        ("raw", "sched_switch"),
        ("raw", "cpu_idle"),
        ("raw", "irq_handler_entry"),
        ("tp", "sched:sched_migrate_task"),
        ("tp", "filemap:mm_filemap_fault"),
        ("raw", "call_function_single_entry"),
        ("raw", "mmap_lock_start_locking"),
    ]
    assert left == ["faults:on_major_done"]


def test_two_programs_on_one_hook_are_two_floors() -> None:
    # sched and cstate each on sched_switch when cstate runs alone: two dispatches an event
    hooks, _ = mirror_hooks(
        ["sched:sched__raw_tracepoint__sched_switch", "cstate:cstate__raw_tracepoint__sched_switch"]
    )
    assert hooks == [("raw", "sched_switch"), ("raw", "sched_switch")]


def test_a_program_on_several_hooks_is_a_floor_on_each() -> None:
    # irq's vectors share one program pair where attachments carry cookies (tp_cookie.py):
    # the name tells no hook, the view's shared_hooks every one
    shared = {"irq:vector_entry_any": ["local_timer_entry", "reschedule_entry"]}
    hooks, left = mirror_hooks(["irq:vector_entry_any", "faults:on_major_done"], shared)
    assert hooks == [("raw", "local_timer_entry"), ("raw", "reschedule_entry")]
    assert left == ["faults:on_major_done"]


def test_a_category_with_underscores() -> None:
    hooks, left = mirror_hooks(["x:x__tracepoint__irq_vectors__local_timer_entry"])
    assert hooks == [("tp", "irq_vectors:local_timer_entry")] and not left


def test_no_program_ran_no_floor_to_load() -> None:
    # a workload no program of the set ran on: its floor run is a plain run (no compile)
    with hook_floor([]) as bpf:
        assert bpf is None


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """bench.default_set with no settling sleep and its workloads on any of this machine's
    CPUs."""
    from bench import default_set

    monkeypatch.setattr(default_set, "SETTLE_S", 0.0)
    monkeypatch.setattr(default_set, "_on_workload_cpu", lambda: None)
    return default_set


def workload(path: Path, body: str, shell: str = "/bin/sh") -> Path:
    """An executable script at `path`: `body` after the interpreter line."""
    path.write_text(f"#!{shell}\n{body}")
    path.chmod(0o755)
    return path


def logging_loop(tmp_path: Path) -> tuple[Path, Path]:
    """A workload that appends its arguments to a log and reports its count times 1 us as its
    elapsed ns, as the workloads report theirs; and the log."""
    log = tmp_path / "runs"
    body = f'read go\necho "$*" >> {log}\necho $(($1 * 1000))\n'
    return workload(tmp_path / "gjb-loop", body), log


def test_a_workload_too_quick_here_is_sized_up(tmp_path: Path, bench: Any) -> None:
    """A run over in 0.3 s is run with four times its count; one long enough keeps it."""
    # reports its count times 3 ms as its elapsed ns
    loop = workload(tmp_path / "gjb-loop", "read go\necho $(($1 * 3000000))\n")
    assert bench.sized(loop, ["100", "7"], 1.0) == ["400", "7"]
    assert bench.sized(loop, ["400", "7"], 1.0) == ["400", "7"]
    assert bench.sized(loop, ["100"], 0.0) == ["100"]


def test_a_run_reads_its_cpu_time_beside_its_clock(tmp_path: Path, bench: Any) -> None:
    """The workload's CPU time is its own (reaped rusage), not the bench's: a loop that
    spins until it has used 0.3 s of CPU reports that much more than one that sleeps 0.3 s
    (both pay the same start-up), under any load."""
    python = "/usr/bin/env python3"
    start = "import sys, time\nsys.stdin.read(1)\n"
    spin = workload(
        tmp_path / "gjb-spin",
        start + "t, c = time.monotonic_ns(), time.process_time()\n"
        "while time.process_time() - c < 0.3: pass\n"
        "print(time.monotonic_ns() - t)\n",
        python,
    )
    nap = workload(
        tmp_path / "gjb-nap",
        start + "t = time.monotonic_ns()\ntime.sleep(0.3)\nprint(time.monotonic_ns() - t)\n",
        python,
    )
    spun, napped = bench.run_workload(spin, [], None), bench.run_workload(nap, [], None)
    assert spun.elapsed_ns >= 300_000_000 and napped.elapsed_ns >= 300_000_000
    assert spun.cpu_ns >= 300_000_000
    assert napped.cpu_ns <= spun.cpu_ns - 250_000_000  # start-up only


def test_round_ratios_pair_each_round_with_its_own_base() -> None:
    from bench.default_set import Run, round_ratios

    base = [Run(100, 50), Run(200, 50)]
    other = [Run(110, 55), Run(200, 60)]
    assert round_ratios(base, other, "elapsed_ns") == [0.0, 10.0]
    assert round_ratios(base, other, "cpu_ns") == [10.0, 20.0]


def test_a_timed_run_follows_an_untimed_share_of_itself(tmp_path: Path, bench: Any) -> None:
    loop, log = logging_loop(tmp_path)
    run = bench.run_workload(loop, ["400", "7"], None, warm_up=0.25)
    assert run.elapsed_ns == 400_000  # the timed run's own figure
    assert log.read_text().splitlines() == ["100 7", "400 7"]
    log.unlink()
    bench.run_workload(loop, ["400", "7"], None)
    assert log.read_text().splitlines() == ["400 7"]


def test_the_warm_up_s_events_are_not_the_timed_run_s(tmp_path: Path, bench: Any) -> None:
    """The set's events while the workload runs give its `py ev/s`, over the timed run's
    time: the untimed warm-up's, counted too, made it a quarter too high."""
    loop, log = logging_loop(tmp_path)

    def timed() -> None:
        with log.open("a") as f:
            f.write("timed from here\n")

    bench.run_workload(loop, ["400", "7"], None, warm_up=0.25, timed=timed)
    assert log.read_text().splitlines() == ["100 7", "timed from here", "400 7"]


def test_a_run_from_before_the_cpu_time_still_reports() -> None:
    """The JSON of a run before the CPU-time columns (and the warm-up) reads back: its CPU
    columns say "-"; they raised KeyError."""
    from bench.default_set import report

    results = Path(__file__).parents[2] / "bench/results/h200/default_set-sized.json"
    r = json.loads(results.read_text())
    assert all("cpu_slowdown_pct_rounds" not in x for x in r["workloads"].values())
    lines = report(r).splitlines()
    rows = [line for line in lines if line.split()[0] in r["workloads"]]
    assert len(rows) == len(r["workloads"]) and all(" - " in row for row in rows), rows
    assert not any("untimed" in line for line in lines)
