"""The app driven by Pilot as a person would: views, opening a gap, filtering, pausing, the
replay controls, a small terminal, a daemon restart, hostile names."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from unittest.mock import patch

import orjson
import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Static, TabbedContent

from gpujitter.errors import GpujitterError
from gpujitter.text import printable
from gpujitter.tui import audit
from gpujitter.tui.app import GpujitterTop
from gpujitter.tui.audit import AuditReport
from gpujitter.tui.feeds import Feed, Receiver
from gpujitter.tui.feeds.replay import ReplayFeed
from gpujitter.tui.feeds.socket import SocketFeed
from gpujitter.tui.views.audit import FindingScreen
from gpujitter.tui.views.breakdown import GapScreen
from gpujitter.tui.views.gaps import GapsTable
from gpujitter.tui.views.gpus import GpuPanel
from tests.tui import node_stream
from tests.tui.conftest import (
    AUDIT,
    Daemon,
    make_app,
    replay_app,
    settled,
    until,
    write_stream,
)

S = 1_000_000_000


def status_line(app: GpujitterTop) -> str:
    return str(app.query_one("#status", Static).render())


def table_rows(table: DataTable) -> list[str]:
    return [" ".join(c.plain for c in table.get_row_at(n)) for n in range(table.row_count)]


def test_tab_and_number_keys_switch_views_and_enter_opens_the_selected_gap() -> None:
    async def scenario() -> None:
        app = replay_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await settled(pilot)
            tabs = app.query_one(TabbedContent)
            seen = [tabs.active]
            for _ in range(4):
                await pilot.press("tab")
                seen.append(tabs.active)
            assert seen == ["gpus", "gaps", "cpus", "audit", "gpus"]
            await pilot.press("shift+tab")
            assert tabs.active == "audit"
            await pilot.press("2")
            assert tabs.active == "gaps"
            table = app.query_one(GapsTable)
            records = node_stream.stream()
            gaps = node_stream.gaps_newest_first(records)
            assert table.row_count == len(gaps)
            # newest first: the engine still holds it for late events
            assert node_stream.gap_id(gaps[0]) not in node_stream.attributions(records)
            assert "attributing" in table_rows(table)[0]
            row, a = node_stream.first_gap_with(records, "alloc_stall")
            await pilot.press(*["down"] * row, "enter")
            await until(pilot, lambda: isinstance(app.screen, GapScreen), "the breakdown")
            text = app.screen.query_one("#breakdown-text", Static).render()
            shown = str(text)
            # The allocator stall: how long, when, its share of the gap, its evidence, the
            # remedy the engine gave.
            dur_ns = a["end_ns"] - a["ts_ns"]
            assert f"GPU {a['gpu']} idle {dur_ns / 1e6:.2f}ms" in shown
            assert node_stream.wall(a["ts_ns"]) in shown
            part = next(p for p in a["parts"] if p["cause"] == "alloc_stall")
            share = f"{round(100 * part['ns'] / dur_ns)}%"
            assert "allocator stall" in shown and f"{part['ns'] / 1e6:.1f} ms" in shown
            assert share in shown
            (call,) = part["evidence"]
            assert f"{call['call']}: {call['count']}× {call['ns'] / 1e6:.2f}ms" in shown
            assert a["remedies"] and a["remedies"][0] in shown
            await pilot.press("escape")
            assert not isinstance(app.screen, GapScreen)
            await pilot.click(GapsTable, offset=(5, 3))  # the mouse: a row, then open it
            await pilot.click(GapsTable, offset=(5, 3))
            await until(pilot, lambda: isinstance(app.screen, GapScreen), "a clicked gap")

    asyncio.run(scenario())


def remote_cpus(records: list[dict]) -> list[int]:
    """The CPUs the stream shows anything remote on: interrupts handled off their device's
    node, or a watched thread last placed off its GPU's node."""
    gpu_node = {
        node_stream.pid(g.index): node_stream.TOPOLOGY.gpu_node[g.pci_bus_id]
        for g in node_stream.GPUS
    }
    last = [r for r in records if r["type"] == "daemon.status"][-1]
    threads = {t["cpu"] for t in last["threads"] if t["node"] != gpu_node[t["tgid"]]}
    irqs = {r["cpu"] for r in records if r["type"] == "cpu.stats" and r.get("remote_irqs")}
    return sorted(threads | irqs)


def test_filter_narrows_the_view_and_escape_clears_it() -> None:
    records = node_stream.stream()
    gaps = node_stream.gaps_newest_first(records)
    swapped = [c for c in node_stream.top_causes(records) if c == "swap_in"]

    async def scenario() -> None:
        app = replay_app()
        async with app.run_test(size=(120, 36)) as pilot:
            await settled(pilot)
            await pilot.press("2", "slash")
            assert app.query_one("#prompt", Input).has_focus
            await pilot.press(*"swap")
            rows = table_rows(app.query_one(GapsTable))
            assert len(rows) == len(swapped) and all("swap-in" in r for r in rows)
            await pilot.press("enter")  # keeps the filter, back to the table
            assert app.query_one(GapsTable).has_focus
            assert len(table_rows(app.query_one(GapsTable))) == len(swapped)
            await pilot.press("slash", "escape")
            assert len(table_rows(app.query_one(GapsTable))) == len(gaps)
            await pilot.press("slash", *"swap", "enter", "escape")  # kept, then esc: cleared
            assert app.query_one(GapsTable).filter == ""
            assert len(table_rows(app.query_one(GapsTable))) == len(gaps)
            await pilot.press("3", "slash", *"remote")  # the CPUs view filters the same way
            cpus = table_rows(app.query_one("#cpus-table", DataTable))
            assert [int(r.split()[0]) for r in cpus] == remote_cpus(records)

    asyncio.run(scenario())


def test_replay_controls_next_gap_step_seek_and_play(tmp_path: Path) -> None:
    gaps = node_stream.gaps_newest_first(node_stream.stream())

    async def scenario() -> None:
        app = replay_app(at="start", playing=False)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.position is not None, "the replay position")
            start = app.position.start_ns
            assert not app.model.gaps
            await pilot.press("n")  # the first gap and its attribution, then paused
            first = node_stream.gap_id(gaps[-1])
            await until(pilot, lambda: first in app.model.attributions, "the first gap")
            assert list(app.model.gaps) == [first]
            assert app.query_one(TabbedContent).active == "gaps"
            assert app.query_one(GapsTable).selected_gap() == first
            assert not app.position.playing
            at = app.position.at_ns
            await pilot.press("full_stop")
            await until(pilot, lambda: app.position.at_ns == at + S, "a step")
            await pilot.press("g", *"+10s", "enter")
            await until(pilot, lambda: app.position.at_ns == at + 11 * S, "a relative seek")
            assert len(app.model.gaps) == sum(g["end_ns"] <= at + 11 * S for g in gaps)
            await pilot.press("g", *"12:00:05", "enter")  # backwards: the model starts over
            await until(pilot, lambda: not app.model.gaps, "a seek back")
            assert app.position.at_ns == node_stream.T0 + 5 * S
            await pilot.press("g", *"end", "enter")
            await until(pilot, lambda: app.position.done, "the end")
            assert len(app.model.gaps) == len(gaps)
            await pilot.press("g", *"start", "enter")
            await until(pilot, lambda: app.position.at_ns == start, "the start")
            await pilot.press("greater_than_sign", "greater_than_sign", "p")
            await until(pilot, lambda: app.position.playing, "playing")
            assert app.position.speed == 4
            await until(pilot, lambda: app.model.now_ns > start, "the replay clock to move")
            await pilot.press("p")
            await until(pilot, lambda: not app.position.playing, "paused")
            assert "replay" in status_line(app) and "×4" in status_line(app)
            with patch.object(app, "notify", wraps=app.notify) as notify:
                await pilot.press("g", *"tomorrow", "enter")  # a bad target says why, in a toast
                await pilot.pause()
            assert any("cannot seek" in str(c.args[0]) for c in notify.call_args_list)

    asyncio.run(scenario())


def test_live_pause_freezes_the_views_and_resume_shows_what_came_meanwhile(
    daemon: Daemon,
) -> None:
    async def scenario() -> None:
        daemon.start()
        app = make_app(SocketFeed(daemon.path))
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.model.hello.pid == 2301, "the hello")
            await pilot.press("2", "p")
            assert "PAUSED" in status_line(app)
            daemon.publish_all()
            n = len(node_stream.gaps_newest_first(daemon.live))
            await until(pilot, lambda: len(app.model.gaps) == n, "the live gaps")
            assert app.query_one(GapsTable).row_count == 0  # frozen while paused
            await pilot.press("p")
            assert app.query_one(GapsTable).row_count == n
            assert "PAUSED" not in status_line(app)

    asyncio.run(scenario())


def test_resizes_down_to_80x24_and_everything_still_fits() -> None:
    async def scenario() -> None:
        app = replay_app()
        async with app.run_test(size=(160, 48)) as pilot:
            await settled(pilot)
            await pilot.resize_terminal(80, 24)
            await pilot.pause()
            assert app.screen.size == (80, 24)
            panels = list(app.query(GpuPanel))
            assert len(panels) == 2 and all(76 <= p.region.width <= 80 for p in panels)
            assert all(p.region.bottom <= 22 for p in panels)  # above status and footer
            status = app.query_one("#status")
            assert status.region.y == 22 and "replay" in status_line(app)
            await pilot.press("2", "enter")
            await until(pilot, lambda: isinstance(app.screen, GapScreen), "the breakdown")
            box = app.screen.query_one("#breakdown")
            assert box.region.right <= 80 and box.region.bottom <= 24

    asyncio.run(scenario())


def test_reconnects_when_the_daemon_restarts(daemon: Daemon) -> None:
    async def scenario() -> None:
        daemon.start(pid=2301)
        feed = SocketFeed(daemon.path, retry_s=0.05, retry_max_s=0.2)
        app = make_app(feed)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: "daemon pid 2301" in status_line(app), "the daemon")
            daemon.publish_all()
            n = len(node_stream.gaps_newest_first(daemon.live))
            await until(pilot, lambda: len(app.model.gaps) == n, "the gaps")
            daemon.stop()
            await until(pilot, lambda: "no daemon, retrying" in status_line(app), "the loss")
            daemon.start(pid=2302)  # the restarted daemon: new pid, its own snapshot
            await until(pilot, lambda: "daemon pid 2302" in status_line(app), "reconnected")
            assert feed.connections >= 2  # (one more if it got in as the old one closed)
            assert len(app.model.gaps) == n  # what was seen before the restart stays

    asyncio.run(scenario())


async def breakdown(pilot: Pilot, records: list[dict], cause: str) -> str:
    """The text of the breakdown of the newest gap with a part of `cause`, opened from the
    gaps view and closed again."""
    app = pilot.app
    row, _ = node_stream.first_gap_with(records, cause)
    await pilot.press("2", *["down"] * row, "enter")
    await until(pilot, lambda: isinstance(app.screen, GapScreen), "the breakdown")
    shown = str(app.screen.query_one("#breakdown-text", Static).render())
    await pilot.press("escape", *["up"] * row)
    return shown


def hostile_stream(tmp_path: Path, kind: str) -> tuple[dict[str, str], list[dict], Path]:
    """The node stream with the `kind` of hostile names: (the names, the records, the file
    a replay reads)."""
    records = node_stream.stream(kind)
    return node_stream.names(kind), records, write_stream(tmp_path / f"{kind}.ndjson", records)


def test_hostile_names_are_shown_literally_and_never_run(tmp_path: Path) -> None:
    """Process, thread and IRQ names that are Textual markup or action links appear as
    typed on every view, and clicking them does nothing."""
    hostile, records, path = hostile_stream(tmp_path, "markup")

    async def scenario() -> None:
        app = replay_app(path)
        async with app.run_test(size=(160, 48)) as pilot:
            await settled(pilot)
            gpus = " ".join(str(p.render()) for p in app.query(GpuPanel))
            assert hostile["trainer"] in gpus and hostile["worker"] in gpus
            await pilot.press("2")
            assert hostile["trainer"] in " ".join(table_rows(app.query_one(GapsTable)))
            await pilot.press("3")
            cpus = " ".join(table_rows(app.query_one("#cpus-table", DataTable)))
            for name in ("trainer", "loader", "worker", "nvme"):
                assert hostile[name] in cpus
            await pilot.click("#cpus-table", offset=(100, 3))  # on the watched threads' names
            waited = await breakdown(pilot, records, "runq_wait")  # behind the task
            assert hostile["kworker"] in waited
            assert hostile["nvme"] in await breakdown(pilot, records, "irq")
            assert app.is_running

    asyncio.run(scenario())


def test_names_wider_than_the_terminal_keep_every_view_inside_it(tmp_path: Path) -> None:
    """Names of 300 characters: the views keep their width at 80x24 (tables scroll, panels
    cut), and the breakdown still carries the whole name."""
    long, records, path = hostile_stream(tmp_path, "long")

    async def scenario() -> None:
        app = replay_app(path)
        async with app.run_test(size=(80, 24)) as pilot:
            await settled(pilot)
            for key, view in (("1", GpuPanel), ("2", GapsTable), ("3", "#cpus-table")):
                await pilot.press(key)
                await pilot.pause()
                shown = [w for w in app.query(view) if w.region.width]  # type: ignore[call-overload]
                assert shown and all(w.region.right <= 80 for w in shown)
            assert app.query_one("#status").region.height == 1
            waited = await breakdown(pilot, records, "runq_wait")
            assert long["kworker"] in waited
            assert app.is_running

    asyncio.run(scenario())


def shown_on_screen(app: GpujitterTop) -> str:
    """Every Static's and every table cell's text on the current screen: what reaches the
    terminal (the test driver writes nothing, so the widgets' output is checked)."""
    out = []
    for widget in app.screen.walk_children():
        if isinstance(widget, Static):
            out.append(str(widget.render()))
        elif isinstance(widget, DataTable):
            out += table_rows(widget)
    return "\n".join(out)


def test_control_sequences_in_names_are_shown_escaped_on_every_view(tmp_path: Path) -> None:
    """A process named ESC ] 0;title BEL set the terminal's title when its gap's breakdown
    opened; names with CSI, C1, bidi overrides or a line break broke the layout. Each view,
    the title, the status line, the breakdown and an audit finding show them escaped."""
    hostile = node_stream.names("control")
    records = node_stream.stream("control")
    _, a = node_stream.first_gap_with(records, "runq_wait")
    (task,) = next(p["evidence"] for p in a["parts"] if p["cause"] == "runq_wait")
    records[0]["host"] = "gpu\x1b]2;host\x07-7"
    for rec in records:
        if rec["type"] == "meta.probe" and rec["state"] != "running":
            rec["reason"] = "libcuda at /tmp/\x1b[8m/libcuda.so.1"
    path = write_stream(tmp_path / "control.ndjson", records)
    doc = orjson.loads(AUDIT.read_bytes())
    worst = next(f for f in doc["findings"] if f["severity"] == "critical")  # listed first
    worst["subject"] = "pid 4242 (\x1b]0;pwned\x07)"
    worst["evidence"][0]["value"] = "\x9b2J\u202e"
    saved = tmp_path / "audit.json"
    saved.write_bytes(orjson.dumps(doc))

    def inert(text: str) -> None:
        assert [ch for line in text.split("\n") for ch in line if not ch.isprintable()] == []

    async def scenario() -> None:
        app = GpujitterTop(ReplayFeed(path, at="end"), audit=lambda: audit.load_file(saved), tz=UTC)
        async with app.run_test(size=(200, 48)) as pilot:
            await settled(pilot)
            seen = []
            for key in ("1", "2", "3", "4"):
                await pilot.press(key)
                seen.append(shown_on_screen(app))
            waited = await breakdown(pilot, records, "runq_wait")
            interrupted = await breakdown(pilot, records, "irq")
            await pilot.press("4", "enter")
            await until(pilot, lambda: isinstance(app.screen, FindingScreen), "a finding")
            finding = shown_on_screen(app)
            for text in (*seen, waited, interrupted, finding):
                inert(text)
            everything = "\n".join(seen)
            assert printable(hostile["trainer"]) in everything  # GPUs, gaps
            assert "gpu\\x1b]2;host\\x07-7" in everything  # the title
            assert "pid 4242 (\\x1b]0;pwned\\x07)" in everything  # the audit table
            assert printable(hostile["loader"]) in everything  # CPUs
            assert printable(hostile["worker"]) == "gpt\\u202etxt.sh" and "gpt\\u202e" in everything
            assert f"kw\\x0afix: rm -rf (tid {task['tid']})" in waited
            assert "nvme\\xff\\x1b[2J" in interrupted
            assert "pid 4242 (\\x1b]0;pwned\\x07)" in finding and "\\u009b2J\\u202e" in finding
            assert app.is_running

    asyncio.run(scenario())


def test_a_saved_audit_that_is_no_regular_file_or_not_one_is_said_not_waited_on(
    tmp_path: Path,
) -> None:
    # A FIFO given to --audit held the audit's worker thread in its open, and with it the
    # app's exit, for ever; evidence that is no list stopped the worker with a TypeError,
    # the view left saying nothing.
    fifo = tmp_path / "audit.fifo"
    os.mkfifo(fifo)
    done: list[str] = []
    reader = threading.Thread(target=lambda: done.append(_load_error(fifo)), daemon=True)
    reader.start()
    reader.join(5)
    assert done == [f"cannot read {fifo}: not a regular file"]
    assert _load_error(Path("/dev/zero")) == "cannot read /dev/zero: not a regular file"
    saved = tmp_path / "audit.json"
    saved.write_bytes(orjson.dumps({"findings": [{"rule": "swap", "evidence": 5}]}))
    (finding,) = audit.load_file(saved).findings
    assert (finding.rule, finding.evidence) == ("swap", ())


def _load_error(path: Path) -> str:
    with pytest.raises(GpujitterError) as err:
        audit.load_file(path)
    return str(err.value)


def test_a_feed_that_breaks_is_shown_and_the_app_stays_up(tmp_path: Path) -> None:
    class Broken(Feed):
        label = "broken"

        def run(self, sink: Receiver, stopped: object) -> None:
            sink.records([{"type": "meta.probe", "ts_ns": 1, "probe": "irq", "state": "running"}])
            raise OSError("the disk went away")

    async def scenario() -> None:
        app = make_app(Broken())
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "feed failed" in status_line(app), "the failure")
            assert "OSError: the disk went away" in status_line(app)
            assert app.model.probes["irq"].state == "running" and app.is_running

    asyncio.run(scenario())


class Scripted(Feed):
    """A live feed that sends `first`, then each later batch when the test sets `go`."""

    label = "scripted"

    def __init__(self, first: list[dict], *later: list[dict]) -> None:
        self.first = first
        self.later = list(later)
        self.go = threading.Event()

    def run(self, sink: Receiver, stopped: Callable[[], bool]) -> None:
        sink.connection("connected")
        sink.records(self.first)
        while not stopped():
            if self.go.wait(0.02) and self.later:
                self.go.clear()
                sink.records(self.later.pop(0))


def test_an_open_breakdown_shows_the_attribution_that_arrives_while_it_is_open() -> None:
    records = node_stream.stream()
    gap = next(r for r in records if r["type"] == "gpu.gap")
    att = node_stream.attributions(records)[node_stream.gap_id(gap)]
    feed = Scripted([records[0], {**records[1], "gaps": [], "attributions": []}, gap], [att])

    async def scenario() -> None:
        app = make_app(feed)
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: bool(app.model.gaps), "the gap")
            await pilot.press("2", "enter")
            await until(pilot, lambda: isinstance(app.screen, GapScreen), "the breakdown")
            assert "Not attributed yet" in str(app.screen.query_one("#breakdown-text").render())
            feed.go.set()
            await until(pilot, lambda: bool(app.model.attributions), "the attribution")
            shown = str(app.screen.query_one("#breakdown-text").render())
            assert "Not attributed yet" not in shown and "Evidence" in shown

    asyncio.run(scenario())


def test_a_daemon_that_stops_sending_is_shown_silent() -> None:
    """Its status comes once a second; connected and silent for longer reads as such, not
    as a live daemon."""
    records = node_stream.stream()

    async def scenario() -> None:
        app = make_app(Scripted(records[:2]))
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: "● daemon pid" in status_line(app), "the daemon")
            assert "silent" not in status_line(app)
            await until(pilot, lambda: "(silent 4 s)" in status_line(app), "silence", 8)

    asyncio.run(scenario())


def test_rerunning_the_audit_while_one_runs_starts_no_second_one() -> None:
    """A thread cannot be cancelled: each `r` started another audit beside the last, and
    the older one could finish last and overwrite the newer result."""
    runs: list[int] = []
    release = threading.Event()

    def slow_audit() -> AuditReport:
        runs.append(len(runs) + 1)
        release.wait(5)
        return AuditReport(origin=f"run {len(runs)}")

    async def scenario() -> None:
        app = GpujitterTop(ReplayFeed(node_stream.NDJSON, at="end", playing=False),
                           audit=slow_audit, tz=UTC)  # fmt: skip
        async with app.run_test(size=(120, 36)) as pilot:
            await pilot.press("4", "r", "r", "r")
            await pilot.pause(0.2)
            assert runs == [1]
            release.set()
            view = app.query_one("#audit-view")
            await until(pilot, lambda: getattr(view, "report", None) is not None, "the audit")
            release.clear()
            deadline = time.monotonic() + 5
            while runs != [1, 2]:  # once the first has ended, `r` runs the audit again
                assert time.monotonic() < deadline, "no second audit"
                await pilot.press("r")
                await pilot.pause(0.05)
            release.set()

    asyncio.run(scenario())
