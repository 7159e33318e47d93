"""The CPUs view keeps its rows from batch to batch rather than rebuilding them: whatever
changes, appears, filters or starts over, its rows are those a rebuild from the same model
shows, and a batch that changes one CPU of thousands draws one row."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import patch

from gpujitter.tui.views import cpus
from gpujitter.tui.views.cpus import CpusTable
from tests.tui.conftest import NothingYet, make_app, send, table_shown

S = 1_000_000_000
MS = 1_000_000

Rows = list[tuple[str, list[str]]]


def irq(cpu: int, ms: int, ts_s: int = 1, name: str = "nvme0q1") -> dict[str, Any]:
    return {"type": "cpu.stats", "ts_ns": ts_s * S, "interval_ns": S, "cpu": cpu,
            "hardirq_ns": ms * MS, "top_irqs": [[name, ms * MS, 10]]}  # fmt: skip


def idle(cpu: int, share: float, ts_s: int = 1) -> dict[str, Any]:
    return {"type": "cpu.stats", "ts_ns": ts_s * S, "interval_ns": S, "cpu": cpu,
            "idle_ns": [["C1", int(share * S)]]}  # fmt: skip


def status(ts_s: int, *placed: tuple[int, int, str]) -> dict[str, Any]:
    """The daemon's status with watched threads (tid, cpu, name) of process 100."""
    threads = [{"tid": tid, "tgid": 100, "comm": comm, "cpu": cpu, "node": 0}
               for tid, cpu, comm in placed]  # fmt: skip
    return {"type": "daemon.status", "ts_ns": ts_s * S, "threads": threads}


def rebuilt(table: CpusTable) -> Rows:
    """The rows a table built from nothing shows: every CPU of the model in order, those its
    filter matches (what every batch did before the table kept its rows)."""
    out = []
    for row in table.model.cpu_rows():
        plain = [c.plain for c in cpus.row_cells(row)]
        if table.filter.lower() in " ".join(plain).lower():
            out.append((str(row.cpu), plain))
    return out


def test_rows_kept_from_batch_to_batch_are_those_a_rebuild_shows() -> None:
    async def scenario() -> None:
        app = make_app(NothingYet())
        async with app.run_test(size=(140, 36)) as pilot:
            await pilot.press("3")
            table = app.query_one(CpusTable)
            await send(pilot, *(irq(c, 1 + c) for c in (0, 2, 4)), idle(1, 0.5))
            assert [k for k, _ in table_shown(table)] == ["0", "1", "2", "4"]
            assert table_shown(table) == rebuilt(table)
            # CPUs appearing between others, a figure changing, a thread placed.
            await send(pilot, irq(3, 40, 2), irq(0, 90, 2), status(2, (101, 2, "trainer")))
            assert [k for k, _ in table_shown(table)] == ["0", "1", "2", "3", "4"]
            assert table_shown(table) == rebuilt(table)
            # Under a filter: a row that comes to match it, one that stops matching it.
            await pilot.press("slash", *"trainer", "enter")
            assert [k for k, _ in table_shown(table)] == ["2"]
            await send(pilot, status(3, (101, 4, "trainer"), (102, 0, "trainer")))
            assert [k for k, _ in table_shown(table)] == ["0", "4"]
            assert table_shown(table) == rebuilt(table)
            await pilot.press("slash", "escape")
            assert table_shown(table) == rebuilt(table) and table.row_count == 5
            # The cursor stays on its row through a batch.
            table.move_cursor(row=3)
            await send(pilot, irq(1, 7, 4), irq(3, 8, 4))
            assert table.cursor_row == 3 and table_shown(table) == rebuilt(table)
            # A replay seeking back: the model starts over, with fewer CPUs.
            await send(pilot, irq(5, 3), reset=True)
            assert [k for k, _ in table_shown(table)] == ["5"] and table_shown(table) == rebuilt(
                table
            )

    asyncio.run(scenario())


def test_a_batch_that_changes_one_cpu_of_thousands_draws_one_row() -> None:
    """The cost the view was slow for (8,192 CPUs rebuilt per batch held a key for
    seconds), counted rather than timed."""

    async def scenario() -> None:
        app = make_app(NothingYet())
        async with app.run_test(size=(140, 36)) as pilot:
            await pilot.press("3")
            table = app.query_one(CpusTable)
            await send(pilot, *(irq(c, 1) for c in range(2048)))
            assert table.row_count == 2048
            with (
                patch.object(cpus, "row_cells", wraps=cpus.row_cells) as built,
                patch.object(table, "add_row", wraps=table.add_row) as added,
                patch.object(table, "clear", wraps=table.clear) as cleared,
            ):
                await send(pilot, irq(1000, 50))
                assert (built.call_count, added.call_count, cleared.call_count) == (1, 0, 0)
            assert table.get_row("1000")[2].plain.strip() == "5.0%"
            assert table_shown(table) == rebuilt(table)

    asyncio.run(scenario())
