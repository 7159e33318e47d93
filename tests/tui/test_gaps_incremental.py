"""The Gaps view keeps its rows from batch to batch rather than rebuilding them: whatever
arrives, evicts, filters or reorders, its rows are those a rebuild from the same model shows,
and a gap arriving at a full table builds one row, not GAP_LIMIT."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import patch

import pytest
from rich.text import Text

from gpujitter.daemon.analysis.records import Part
from gpujitter.probes.events import to_record
from gpujitter.tui.model import GAP_LIMIT
from gpujitter.tui.views.breakdown import GapScreen
from gpujitter.tui.views.gaps import SORTS, GapsTable
from tests.tui.conftest import NothingYet, make_app, send, table_shown, until
from tests.tui.test_model import attribution, gap

S = 1_000_000_000
MS = 1_000_000

Rows = list[tuple[str, list[str]]]


def gap_rec(n: int, gpu: int, dur_ms: int) -> dict[str, Any]:
    return to_record(gap(n * S, n * S + dur_ms * MS, gpu))


def gap_id(n: int, gpu: int) -> str:
    return f"{gpu}:{n * S}"


def att_rec(n: int, gpu: int, dur_ms: int, cause: str, comm: str = "python3") -> dict[str, Any]:
    """Gap `n` on `gpu` attributed: `cause` takes three quarters of it."""
    top = dur_ms * MS * 3 // 4
    parts = (Part(cause, top, tids=(101,)), Part("unexplained", dur_ms * MS - top))
    return to_record(attribution(ts_ns=n * S, end_ns=n * S + dur_ms * MS, gpu=gpu,
                                 parts=parts, tid=101, tgid=100, comm=comm))  # fmt: skip


def rebuilt(table: GapsTable) -> Rows:
    """The rows a table built from nothing shows: the model's gaps in the table's order,
    those its filter matches (what every batch did before the table kept its rows)."""
    rows = sorted(table.model.gaps_newest_first(), key=SORTS[table.order][2])
    cells = [(g.gap_id, table.row_cells(g, a)) for g, a in rows]
    return [(k, [c.plain for c in row]) for k, row in cells if table.matches(row)]


def check(table: GapsTable) -> None:
    expected = rebuilt(table)
    assert table_shown(table) == expected
    total = len(table.model.gaps)
    count = f"{total} gaps" if len(expected) == total else f"{len(expected)} of {total} gaps"
    assert Text.from_markup(str(table.border_title)).plain.startswith(count)


def test_rows_kept_from_batch_to_batch_are_those_a_rebuild_shows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("gpujitter.tui.model.GAP_LIMIT", 12)  # evictions with a few gaps

    async def scenario() -> None:
        app = make_app(NothingYet())
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("2")
            table = app.query_one(GapsTable)
            # Two GPUs idle at the same times for as long: ties in every order.
            await send(pilot, *(gap_rec(n, gpu, 10 + n % 3) for n in range(1, 6) for gpu in (0, 1)))
            check(table)
            await send(pilot, att_rec(1, 0, 11, "irq"), att_rec(2, 1, 12, "swap_in"),
                       att_rec(3, 0, 10, "irq", comm="data_loader"))  # fmt: skip
            check(table)
            await pilot.press("slash", *"irq", "enter")
            check(table)
            assert table.row_count == 2
            # Under the filter: an attribution that matches it, one that does not, a gap
            # whose record is replaced (longer now), new gaps evicting the oldest.
            await send(pilot, att_rec(4, 1, 11, "irq"), att_rec(5, 0, 12, "runq_wait"),
                       gap_rec(3, 0, 40), *(gap_rec(n, 0, 5) for n in range(6, 10)))  # fmt: skip
            check(table)
            assert gap_id(1, 0) not in app.model.gaps and gap_id(1, 1) not in app.model.gaps
            await pilot.press("slash", "escape")
            check(table)
            # Each order in turn, then a batch: a new gap on top (in time order), an
            # attribution replaced by another cause, one arriving.
            for n, cause in enumerate(("alloc_stall", "irq", "swap_in")):
                await pilot.press("s")
                check(table)
                table.select_gap(gap_id(4, 1))  # (a new order starts at the top, as it always has)
                await send(pilot, gap_rec(20 + n, 1, 30), att_rec(5, 1, 12, cause),
                           att_rec(6 + n, 0, 5, cause))  # fmt: skip
                check(table)
                assert table.selected_gap() == gap_id(4, 1)
            assert table.order == "time"
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, GapScreen), "the breakdown")
            assert isinstance(app.screen, GapScreen) and app.screen.gap.gap_id == gap_id(4, 1)
            await pilot.press("escape")
            # A replay seeking back: the model starts over.
            await send(pilot, gap_rec(2, 0, 7), att_rec(2, 0, 7, "swap_in"), reset=True)
            check(table)
            assert table.row_count == 1

    asyncio.run(scenario())


def test_a_gap_arriving_at_a_full_table_builds_one_row() -> None:
    """The cost the table was slow for, counted rather than timed: one gap arriving (and
    the oldest evicted) at GAP_LIMIT rows, then its attribution, each touch one row."""

    async def scenario() -> None:
        app = make_app(NothingYet())
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("2")
            table = app.query_one(GapsTable)
            await send(pilot, *(gap_rec(n, n % 2, 10 + n % 7) for n in range(1, GAP_LIMIT + 1)))
            assert table.row_count == GAP_LIMIT
            selected = table.selected_gap()
            with (
                patch.object(table, "row_cells", wraps=table.row_cells) as built,
                patch.object(table, "add_row", wraps=table.add_row) as added,
                patch.object(table, "remove_row", wraps=table.remove_row) as removed,
            ):
                await send(pilot, gap_rec(GAP_LIMIT + 1, 1, 8))
                assert (built.call_count, added.call_count, removed.call_count) == (1, 1, 1)
                assert table.row_count == GAP_LIMIT and table.selected_gap() == selected
                await send(pilot, att_rec(GAP_LIMIT + 1, 1, 8, "irq"))
                assert (built.call_count, added.call_count, removed.call_count) == (2, 1, 1)
            check(table)

    asyncio.run(scenario())
