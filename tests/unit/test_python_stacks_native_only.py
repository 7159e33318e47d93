"""Which feeders python_stacks samples by their native frame alone (native_only): those in no
interpreter's thread list, of a watched process, the ones already sampled first, a bounded
number."""

from __future__ import annotations

from gpujitter.probes.python_stacks import MAX_NATIVE_ONLY, NATIVE_ONLY, native_only

PROCESS = {10: 1, 11: 1, 12: 1, 20: 2}.get  # thread -> its watched process (None: not one)


def test_feeders_in_no_thread_list_of_watched_processes() -> None:
    wanted = native_only({10, 11, 12, 20, 30}, python={11}, held=set(), process_of=PROCESS)
    # 11 is a Python thread (its own path), 30 is gone, a kernel thread or not watched
    assert wanted == {(1, 10): NATIVE_ONLY, (1, 12): NATIVE_ONLY, (2, 20): NATIVE_ONLY}


def test_no_feeders_none() -> None:
    assert native_only(set(), python={11}, held=set(), process_of=PROCESS) == {}


def test_at_most_max_native_only_those_held_first() -> None:
    many = set(range(1000, 1000 + 2 * MAX_NATIVE_ONLY))
    held = {max(many)}
    wanted = native_only(many, python=set(), held=held, process_of=lambda tid: 5)
    assert len(wanted) == MAX_NATIVE_ONLY
    assert (5, max(many)) in wanted  # kept though last by id: no event closed and reopened
    assert sorted(tid for _, tid in wanted)[:-1] == sorted(many)[: MAX_NATIVE_ONLY - 1]


def test_a_thread_reading_as_another_process_now_is_keyed_by_it() -> None:
    """A thread id reused by another watched process is that process's thread: a new key,
    so the old one's perf event is closed and a new one opened on the new thread."""
    wanted = native_only({10}, python=set(), held={10}, process_of=lambda tid: 7)
    assert wanted == {(7, 10): NATIVE_ONLY}


def test_python_threads_are_not_looked_up() -> None:
    asked: list[int] = []

    def gone(tid: int) -> None:
        asked.append(tid)

    assert native_only({1, 2, 3}, python={2}, held=set(), process_of=gone) == {}
    assert asked == [1, 3]  # a Python thread is not looked up
