"""The app explains itself (issue 15, items 5 and 6), driven by Pilot: `?` lists every key
of the app and of the view it is opened on; the palette runs views, sorts and filters by
name; `s` orders the gaps and the title says how; the filter stays in sight; gap marks and
idle bars take their cause's colour; eight GPUs fit 160×48; and a live view with no GPU
offers the example recording and a drill."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

from textual.widgets import Static, TabbedContent

from gpujitter.cli.top import EXAMPLE_TRACE, example_offer
from gpujitter.daemon.analysis.engine.causes import (
    CAUSE_ORDER,
    cause_colour,
    cause_label,
    cause_rank,
)
from gpujitter.tui.app import GpujitterTop, Offer
from gpujitter.tui.decode import PENDING
from gpujitter.tui.feeds.replay import ReplayFeed
from gpujitter.tui.views.audit import AuditView
from gpujitter.tui.views.gaps import GapsTable
from gpujitter.tui.views.gpus import DRILL, GpuPanel, GpusView
from gpujitter.tui.views.help import HelpScreen, expand
from gpujitter.tui.views.timeline import GAP_MARK, PENDING_MARK, gap_marks, legend
from tests.tui import node_stream
from tests.tui.conftest import DRILL_TRACE, NothingYet, make_app, replay_app, settled, until
from tests.tui.test_app import status_line, table_rows

S = 1_000_000_000
MS = 1_000_000


def durations_ms(table: GapsTable) -> list[float]:
    return [float(table.get_row_at(n)[2].plain.removesuffix("ms")) for n in range(table.row_count)]


def test_help_lists_every_key_of_the_app_and_of_the_view_it_is_opened_on() -> None:
    async def scenario() -> None:
        app = replay_app()
        async with app.run_test(size=(120, 48)) as pilot:
            await settled(pilot)
            for key, view in (("1", None), ("2", GapsTable), ("4", AuditView)):
                await pilot.press(key, "question_mark")
                await until(pilot, lambda: isinstance(app.screen, HelpScreen), "the help")
                shown = str(app.screen.query_one("#help-text", Static).render())
                own = vars(view).get("BINDINGS", []) if view else []
                for b in expand([*GpujitterTop.BINDINGS, *own]):
                    assert b.tooltip and b.tooltip in shown, b
                    assert app.get_key_display(b) in shown, b
                assert "^p" in shown and "command palette" in shown
                await pilot.press("escape")
                assert not isinstance(app.screen, HelpScreen)
            await pilot.press("2", "question_mark")
            assert "In the Gaps view" in str(app.screen.query_one("#help-text", Static).render())

    asyncio.run(scenario())


def test_s_cycles_the_gaps_order_and_the_header_says_which() -> None:
    records = node_stream.stream()
    gaps = node_stream.gaps_newest_first(records)
    durations = [(g["end_ns"] - g["ts_ns"]) / MS for g in gaps]
    # By cause: the cause table's order, the gaps still being attributed last; within a
    # cause, longest first.
    by_cause = sorted(
        zip(node_stream.top_causes(records), durations, strict=True),
        key=lambda c: (c[0] is None, cause_rank(c[0] or ""), -c[1]),
    )

    async def scenario() -> None:
        app = replay_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await settled(pilot)
            await pilot.press("2")
            table = app.query_one(GapsTable)
            times = [r.split()[0] for r in table_rows(table)]
            assert times == sorted(times, reverse=True)
            assert "sorted by time, newest first" in str(table.border_title)
            await pilot.press("s")
            assert durations_ms(table) == sorted(durations_ms(table), reverse=True)
            assert durations_ms(table)[0] == max(durations)
            assert str(table.columns["DURATION"].label) == "DURATION ▼"
            assert "sorted by duration, longest first" in str(table.border_title)
            await pilot.press("s")
            causes = [str(table.get_row_at(n)[4]) for n in range(table.row_count)]
            assert causes == [cause_label(c) if c else f"{PENDING[0]}…" for c, _ in by_cause]
            assert durations_ms(table) == [ms for _, ms in by_cause]
            assert str(table.columns["TOP CAUSE"].label) == "TOP CAUSE ▼"
            await pilot.press("s")
            assert table.order == "time" and str(table.columns["TIME"].label) == "TIME ▼"

    asyncio.run(scenario())


def test_the_active_filter_is_always_in_sight() -> None:
    tops = node_stream.top_causes(node_stream.stream())
    irq = tops.count("irq")

    async def scenario() -> None:
        app = replay_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await settled(pilot)
            await pilot.press("2", "slash", *"irq", "enter")
            table = app.query_one(GapsTable)
            assert irq and table.row_count == irq
            title = str(table.border_title)
            assert f"{irq} of {len(tops)} gaps" in title and 'filter "irq"' in title
            assert 'filter "irq"' in status_line(app)
            await pilot.press("1")  # the GPUs view has no filter of its own
            assert "filter" not in status_line(app)
            await pilot.press("2", "slash", "escape")
            assert "no filter" in str(table.border_title)
            assert "filter" not in status_line(app)

    asyncio.run(scenario())


def test_the_palette_runs_views_sorts_filters_and_replay_controls_by_name() -> None:
    async def scenario() -> None:
        app = replay_app(at="start")
        async with app.run_test(size=(120, 36)) as pilot:
            await settled(pilot)
            titles = {c.title for c in app.get_system_commands(app.screen)}
            assert {"GPUs", "Gaps", "CPUs", "Audit", "Next gap", "Seek", "Faster",
                    "Sort gaps by duration", "Sort gaps by cause",
                    "Clear the filter"} <= titles  # fmt: skip
            assert {f"Filter gaps: {c.label}" for c in CAUSE_ORDER} <= titles
            await pilot.press("ctrl+p")
            await pilot.press(*"next gap", "enter")  # a replay control, by name
            await until(pilot, lambda: len(app.model.attributions) == 1, "the first gap")
            await pilot.press("ctrl+p", *"sort gaps by duration", "enter")
            await until(pilot, lambda: app.query_one(GapsTable).order == "duration", "the sort")
            await pilot.press("g", *"end", "enter")
            await until(pilot, lambda: app.position.done, "the end")
            await pilot.press("ctrl+p", *"filter gaps: swap-in", "enter")
            await until(pilot, lambda: app.query_one(GapsTable).filter == "swap-in", "a filter")
            assert app.query_one(TabbedContent).active == "gaps"
            swapped = node_stream.top_causes(node_stream.stream()).count("swap_in")
            assert len(table_rows(app.query_one(GapsTable))) == swapped

    asyncio.run(scenario())


def test_live_feeds_get_no_replay_commands() -> None:
    async def scenario() -> None:
        app = make_app(NothingYet())
        async with app.run_test(size=(120, 36)):
            titles = {c.title for c in app.get_system_commands(app.screen)}
            assert "Pause" in titles and "GPUs" in titles
            assert not {"Next gap", "Seek", "Faster", "Example"} & titles

    asyncio.run(scenario())


def test_gap_marks_take_their_top_causes_colour_with_a_legend() -> None:
    gaps = [(1 * S, 2 * S, "swap_in"), (5 * S, 6 * S, None), (5 * S, 5 * S + 1, "irq")]
    marks, n = gap_marks(gaps, 0, 10 * S, 10)
    assert n == 3 and marks.plain == f"·{GAP_MARK}···{GAP_MARK}····"
    styles = [str(s.style) for s in marks.spans if s.end - s.start == 1 and s.start in (1, 5)]
    assert styles == [f"bold {cause_colour('swap_in')}", f"bold {cause_colour('irq')}"]
    only_pending, _ = gap_marks([(5 * S, 6 * S, None)], 0, 10 * S, 10)
    assert only_pending.plain[5] == PENDING_MARK
    key = legend(["irq", None, "swap_in", "irq"])
    assert key.plain == f"{GAP_MARK} swap-in  {GAP_MARK} IRQs  {PENDING_MARK} {PENDING[0]}"


def test_each_gpu_shows_where_its_idle_time_went_in_the_window() -> None:
    async def scenario() -> None:
        app = replay_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await settled(pilot)
            spent = dict(app.model.idle_by_cause(0, app.model.now_ns - 60 * S))
            records = node_stream.stream()
            gaps = [g for g in node_stream.gaps_newest_first(records) if g["gpu"] == 0]
            found = node_stream.attributions(records)
            pending = [g for g in gaps if node_stream.gap_id(g) not in found]
            assert pending and spent[None] == sum(g["end_ns"] - g["ts_ns"] for g in pending)
            by_cause: Counter[str] = Counter()
            for g in gaps:
                for part in found.get(node_stream.gap_id(g), {}).get("parts", ()):
                    by_cause[part["cause"]] += part["ns"]
            assert {c: ns for c, ns in spent.items() if c} == dict(by_cause)
            total = sum(g["end_ns"] - g["ts_ns"] for g in gaps)
            assert sum(spent.values()) == total
            (top, top_ns), *_ = by_cause.most_common()
            panel = app.query_one("#gpu-0", GpuPanel)
            idle = next(line for line in str(panel.render()).split("\n") if line.startswith("idle"))
            assert f"{cause_label(top)} {round(100 * top_ns / total)}%" in idle
            assert idle.endswith(f"{total // MS}ms")
            legend_line = str(app.query_one("#gpus-legend", Static).render())
            assert legend_line.startswith("gaps by top cause: ") and "attributing" in legend_line

    asyncio.run(scenario())


def test_eight_gpus_fit_160x48_and_two_keep_their_boxes(eight_gpu_stream: Path) -> None:
    async def scenario() -> None:
        app = replay_app(eight_gpu_stream)
        async with app.run_test(size=(160, 48)) as pilot:
            await settled(pilot)
            panels = list(app.query(GpuPanel))
            assert [p.gpu for p in panels] == list(range(8))
            assert app.query_one(GpusView).compact
            status = app.query_one("#status")
            assert all(p.region.height == 5 for p in panels)
            assert panels[-1].region.bottom <= status.region.y  # nothing scrolled away
            # every gap the pipeline produced is marked, in its cause's colour
            assert sum(str(p.render()).count(GAP_MARK) > 0 for p in panels) == 7
        app = replay_app()
        async with app.run_test(size=(160, 48)) as pilot:
            await settled(pilot)
            assert not app.query_one(GpusView).compact

    asyncio.run(scenario())


def test_the_empty_live_view_offers_the_example_and_a_drill() -> None:
    opened: list[Path] = []

    def open_example() -> ReplayFeed:
        opened.append(DRILL_TRACE)
        return ReplayFeed(DRILL_TRACE, at="start")

    offer = Offer(f"gpujitter top --replay {EXAMPLE_TRACE}", open_example)

    async def scenario() -> None:
        app = make_app(NothingYet(), example=offer)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.connection is not None, "the feed")
            note = str(app.query_one("#no-gpu", Static).render())
            assert "No GPU seen yet" in note
            assert offer.command in note and DRILL in note
            await pilot.press("e")
            assert opened == [DRILL_TRACE] and "replay drill-contention" in str(
                app.query_one("#title", Static).render()
            )
            await until(pilot, lambda: app.position is not None, "the replay")
            await pilot.press("g", *"end", "enter")  # (it plays in real time from the start)
            await until(
                pilot,
                lambda: (
                    # The drill's three stalls, and a 5 ms wait the feeder really had inside
                    # a sync behind another task (found since the detector sees those).
                    sum(a.top.cause == "runq_wait" for a in app.model.attributions.values()) >= 3
                ),
                "the drill's three stalls, explained",
            )
            await pilot.press("e")  # offered once: a replay is no live view
            assert opened == [DRILL_TRACE]
        bare = make_app(NothingYet())
        async with bare.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: bare.connection is not None, "the feed")
            note = str(bare.query_one("#no-gpu", Static).render())
            assert DRILL in note and "gpujitter top --replay" not in note

    asyncio.run(scenario())


def test_the_example_is_offered_only_where_the_file_is(tmp_path: Path) -> None:
    assert example_offer(tmp_path / "h200-training.gjtrace") is None
    there = tmp_path / "h200-training.gjtrace"
    there.write_bytes(DRILL_TRACE.read_bytes())
    offer = example_offer(there)
    assert offer is not None and offer.command == f"gpujitter top --replay {there}"
    assert isinstance(offer.open(), ReplayFeed)
    assert str(EXAMPLE_TRACE) == "examples/h200-training.gjtrace"


def test_a_gap_on_no_known_gpu_is_shown_as_gpu_question_mark() -> None:
    """The drill's stub libcuda feeds no GPU NVML lists: its gaps are on GPU -1."""

    async def scenario() -> None:
        app = make_app(ReplayFeed(DRILL_TRACE, at="end", playing=False))
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: len(app.model.attributions) >= 3, "the drill's gaps")
            await until(pilot, lambda: bool(app.query(GpuPanel)), "its panel")
            assert app.query_one(GpuPanel).header().plain.startswith("GPU ?")

    asyncio.run(scenario())
