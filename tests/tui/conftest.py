"""Helpers for the TUI's tests: the fixed node stream, apps over a replay or a real daemon
stream socket, and waiting for the app to have taken in what its feed sent."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.pilot import Pilot
from textual.widgets import DataTable

from gpujitter.daemon.sinks.stream import StreamServer
from gpujitter.tui import audit
from gpujitter.tui.app import GpujitterTop
from gpujitter.tui.feeds import Feed, Receiver
from gpujitter.tui.feeds.replay import ReplayFeed
from tests.tui import eight_gpus, node_stream
from tests.unit.forked import NOBODY

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tui"
AUDIT = FIXTURES / "audit-two-node-bad.json"
STREAM = FIXTURES / "node-stream.ndjson"
# `gpujitter drill contention --duration 6s --stalls 3 --keep-trace` on the development VM
# (stub libcuda, no GPU): three stalls of 25 ms, each attributed to run-queue wait.
DRILL_TRACE = FIXTURES / "drill-contention.gjtrace"


def make_app(feed: Feed, **kwargs: Any) -> GpujitterTop:
    """The app as `gpujitter top` builds it, with wall times in UTC and a saved audit."""
    return GpujitterTop(feed, audit=lambda: audit.load_file(AUDIT), tz=UTC, **kwargs)


def replay_app(path: Path = STREAM, at: str = "end", playing: bool = False) -> GpujitterTop:
    return make_app(ReplayFeed(path, at=at, playing=playing))


class NothingYet(Feed):
    """A live feed on a node with no GPU and no gap yet: running, and silent."""

    label = "embedded"

    def run(self, sink: Receiver, stopped: Callable[[], bool]) -> None:
        sink.connection("embedded")
        while not stopped():
            time.sleep(0.02)


@pytest.fixture
def eight_gpu_stream(tmp_path: Path) -> Path:
    return eight_gpus.write(tmp_path / "eight-gpus.ndjson")


def write_stream(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_bytes(node_stream.ndjson(records))
    return path


async def until(pilot: Pilot, ready: Callable[[], bool], what: str, timeout: float = 10) -> None:
    """Let the app run until `ready()` holds (the feed's thread and the UI's messages
    need real time; the test asserts on the state reached, never on how long it took)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.02)
    await pilot.pause()


async def send(pilot: Pilot, *records: dict[str, Any], reset: bool = False) -> None:
    """One batch from the feed, taken in and drawn as the app does."""
    app = pilot.app
    assert isinstance(app, GpujitterTop)
    if reset:
        app.inbox.reset()
    app.inbox.records(records)
    await until(pilot, lambda: not app.inbox.pending, "the batch")


def table_shown(table: DataTable[Text]) -> list[tuple[str, list[str]]]:
    """A table's rows as drawn: each row's key and its cells' text, in order."""
    return [(str(r.key.value), [c.plain for c in table.get_row(r.key)]) for r in table.ordered_rows]


async def settled(pilot: Pilot) -> None:
    """A replay app has delivered everything up to its position and filled every view."""
    app = pilot.app
    assert isinstance(app, GpujitterTop)

    def ready() -> bool:
        pos = app.position
        audit_view = app.query_one("#audit-view")
        return (
            pos is not None
            and not app.inbox.pending
            and app.model.now_ns >= pos.at_ns - 1_000_000_000
            and getattr(audit_view, "report", None) is not None
        )

    await until(pilot, ready, "the replay to settle")


class Daemon:
    """A real daemon.stream.StreamServer on a path, serving a recorded hello and snapshot,
    that a test can stop and start again (a daemon restart)."""

    def __init__(self, path: Path, records: list[dict[str, Any]], pid: int = 2301) -> None:
        self.path = path
        self.hello = {k: v for k, v in records[0].items() if k not in ("type", "schema", "scope")}
        self.hello["pid"] = pid
        self.snapshot = records[1]
        self.live = records[2:]
        self.server: StreamServer | None = None

    def start(self, pid: int | None = None) -> StreamServer:
        if pid is not None:
            self.hello["pid"] = pid
        self.server = StreamServer(
            self.path, hello=lambda: dict(self.hello), snapshot=lambda: [self.snapshot]
        ).start()
        return self.server

    def publish_all(self) -> None:
        assert self.server is not None
        for rec in self.live:
            self.server.publish(rec)

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None


@pytest.fixture
def closed_to_others() -> Iterator[Path]:
    """A listening stream socket only root may connect to (mode 0600, as a daemon's with
    socket.mode 0600), in a folder anyone may search: what a user not in the socket's group
    meets. No mode shuts root out (the suite's user), so the test runs its client as nobody."""
    folder = Path(tempfile.mkdtemp(prefix="gj-sock-"))
    folder.chmod(0o755)
    path = folder / "gpujitter.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
        path.chmod(0o600)
        listener.listen()
        yield path
    shutil.rmtree(folder)


def python_as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python argv...` run as nobody from the repository root (tests.* importable)."""
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, *argv], user=NOBODY, cwd=root, capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=60, check=False,
    )  # fmt: skip


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "gpujitter.sock", node_stream.stream())
    yield d
    d.stop()
