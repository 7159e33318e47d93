"""The wall clock against the monotonic one: a step told from NTP's slewing, and a
recording's references each read for the times after it."""

from __future__ import annotations

from gpujitter.probes.clock import Clocks, clock_ref, stepped
from gpujitter.probes.events import ClockRef

S = 1_000_000_000


def ref(ts_s: int, wall_s: int, wall_ns: int = 0) -> ClockRef:
    return ClockRef(ts_ns=ts_s * S, realtime_ns=wall_s * S + wall_ns)


def test_a_step_is_the_wall_clocks_move_against_the_monotonic_one() -> None:
    start = ref(100, 1_800_000_000)
    assert stepped(start, ref(160, 1_800_000_060)) == 0  # both moved alike: no step
    assert stepped(start, ref(160, 1_800_000_060, 900_000)) == 0  # under 1 ms: the readings' noise
    assert stepped(start, ref(160, 1_800_000_060, 2_000_000)) == 2_000_000
    assert stepped(start, ref(160, 1_800_000_055)) == -5 * S  # set back
    now = clock_ref()  # two readings of this machine's clocks, back to back
    assert stepped(now, clock_ref()) == 0


def test_a_time_is_read_by_the_latest_reference_taken_at_or_before_it() -> None:
    first, later = ref(100, 1_800_000_000), ref(200, 1_800_003_700)  # set an hour on at ~200 s
    clocks = Clocks(first)
    clocks.add(later)
    clocks.add(ref(150, 1_700_000_000))  # out of order: no reference of this recording
    assert clocks.at(50 * S) == first  # before any: the first (the header's)
    assert clocks.at(199 * S) == first
    assert clocks.at(200 * S) == clocks.at(300 * S) == later


def test_a_reference_out_of_time_order_is_followed_where_it_is_known_and_else_said() -> None:
    """One taken before the latest was dropped without a word: a repeat of the clock in
    force at its time says nothing new; one that says what the next reference says is its
    step seen earlier (a meta.clock written after a rotation's header took the new clock),
    followed from its time and said there; any other is not followed, and said."""
    first, later = ref(100, 1_800_000_000), ref(200, 1_800_003_700)  # set an hour on by 200 s
    clocks = Clocks(first)
    clocks.add(later)
    clocks.add(ref(150, 1_800_000_050))  # a repeat of the first
    assert clocks.at(199 * S) == first and len(clocks.notes) == 1
    clocks.add(earlier := ref(180, 1_800_003_680))  # the hour's step, seen at 180 s
    assert clocks.at(179 * S) == first and clocks.at(180 * S) == clocks.at(199 * S) == earlier
    (step,) = clocks.notes  # said once, where it was first seen
    assert step.startswith("clock: the wall clock was set +3600.000 s during the recording, at")
    clocks.add(ref(120, 1_800_001_820))  # half an hour on, at 120 s: none of the others says so
    assert clocks.at(150 * S) == first
    assert clocks.notes[0] == step and clocks.notes[1].startswith(
        "clock: a wall-clock reference out of time order (taken before one read ahead of it"
    )
    assert clocks.notes[1].endswith("(+1800.000 s): not followed")
