"""bench/default_set.py's hook floor: each of the set's programs maps to the hook it runs on,
one empty program per program (the kernel runs every attached program of a hook), and the
programs whose hook the function name does not give are listed, not dropped silently."""

from __future__ import annotations

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


def test_a_category_with_underscores() -> None:
    hooks, left = mirror_hooks(["x:x__tracepoint__irq_vectors__local_timer_entry"])
    assert hooks == [("tp", "irq_vectors:local_timer_entry")] and not left


def test_no_program_ran_no_floor_to_load() -> None:
    # a workload no program of the set ran on: its floor run is a plain run (no compile)
    with hook_floor([]) as bpf:
        assert bpf is None
