"""Pinned screenshots of every view on the fixed node stream (tests/tui/node_stream.py), wall
times in UTC: a change to how the app looks fails here until the new look is accepted with
`pytest tests/tui/test_snapshots.py --snapshot-update` (and then checked by eye: a report
of the differences is written when these fail). docs/tui.md shows these same files."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Input

from gpujitter.cli.top import EXAMPLE_TRACE
from gpujitter.tui.app import Offer
from gpujitter.tui.views.gaps import GapsTable
from tests.tui.conftest import DRILL_TRACE, NothingYet, make_app, replay_app, settled, until

DOCS = (120, 36)
SMALL = (80, 24)
EIGHT = (160, 48)
SnapCompare = Callable[..., bool]


def after(*keys: str) -> Callable[[Pilot], Coroutine[Any, Any, None]]:
    """Wait for the replay to settle, then press `keys` (and let the screen settle)."""

    async def run_before(pilot: Pilot) -> None:
        await settled(pilot)
        await pilot.press(*keys)
        await pilot.pause()

    return run_before


def test_gpus_view(snap_compare: SnapCompare) -> None:
    assert snap_compare(replay_app(), terminal_size=DOCS, run_before=after())


def test_gaps_view(snap_compare: SnapCompare) -> None:
    assert snap_compare(replay_app(), terminal_size=DOCS, run_before=after("2"))


def test_gap_breakdown(snap_compare: SnapCompare) -> None:
    keys = ("2", *["down"] * 5, "enter")  # 12:00:33.055: the allocator stall
    assert snap_compare(replay_app(), terminal_size=DOCS, run_before=after(*keys))


def test_cpus_view(snap_compare: SnapCompare) -> None:
    assert snap_compare(replay_app(), terminal_size=DOCS, run_before=after("3"))


def test_audit_view(snap_compare: SnapCompare) -> None:
    assert snap_compare(replay_app(), terminal_size=DOCS, run_before=after("4"))


def test_audit_finding(snap_compare: SnapCompare) -> None:
    assert snap_compare(replay_app(), terminal_size=DOCS, run_before=after("4", "enter"))


def test_gpus_view_at_80x24(snap_compare: SnapCompare) -> None:
    assert snap_compare(replay_app(), terminal_size=SMALL, run_before=after())


def test_gaps_view_filtered_at_80x24(snap_compare: SnapCompare) -> None:
    # The prompt's cursor blinks: the screenshot caught it on or off (1 run in 3 failed,
    # the text the same), so it is held still; and each key typed filters on its own
    # message, so the test waits for the whole word.
    async def run_before(pilot: Pilot) -> None:
        pilot.app.query_one("#prompt", Input).cursor_blink = False
        await after("2", "slash", *"irq")(pilot)
        view = pilot.app.query_one(GapsTable)
        await until(pilot, lambda: view.filter == "irq", "the filter typed")

    assert snap_compare(replay_app(), terminal_size=SMALL, run_before=run_before)


def test_gap_breakdown_at_80x24(snap_compare: SnapCompare) -> None:
    keys = ("2", *["down"] * 3, "enter")  # 12:00:41.605: the swap-in of the thread it waited on
    assert snap_compare(replay_app(), terminal_size=SMALL, run_before=after(*keys))


def test_replay_at_its_first_gap(snap_compare: SnapCompare) -> None:
    app = replay_app(at="start")

    async def run_before(pilot: Pilot) -> None:
        await settled(pilot)
        await pilot.press("n")
        await until(pilot, lambda: len(app.model.attributions) == 1, "the first gap")
        await pilot.press("1")
        await settled(pilot)

    assert snap_compare(app, terminal_size=DOCS, run_before=run_before)


def test_eight_gpus_at_160x48(snap_compare: SnapCompare, eight_gpu_stream: Path) -> None:
    assert snap_compare(replay_app(eight_gpu_stream), terminal_size=EIGHT, run_before=after())


def test_gaps_by_top_cause(snap_compare: SnapCompare) -> None:
    assert snap_compare(replay_app(), terminal_size=DOCS, run_before=after("2", "s", "s"))


def test_help_on_the_gaps_view(snap_compare: SnapCompare) -> None:
    keys = ("2", "question_mark")
    assert snap_compare(replay_app(), terminal_size=DOCS, run_before=after(*keys))


def test_first_screen_without_a_gpu(snap_compare: SnapCompare) -> None:
    """`make run` on a node with no GPU and no daemon: what a newcomer sees first."""
    from gpujitter.tui.feeds.replay import ReplayFeed

    offer = Offer(f"gpujitter top --replay {EXAMPLE_TRACE}", lambda: ReplayFeed(DRILL_TRACE))
    app = make_app(NothingYet(), example=offer)

    async def run_before(pilot: Pilot) -> None:
        await until(pilot, lambda: app.connection is not None, "the feed")
        await until(pilot, lambda: app.query_one("#audit-view").report is not None, "audit")

    assert snap_compare(app, terminal_size=DOCS, run_before=run_before)
