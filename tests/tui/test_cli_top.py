"""`gpujitter top`'s command line: which feed it picks, where a replay starts, the one-line
errors and how a signal ends it (the app itself is tested through Pilot)."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import io
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpujitter.cli import build_parser, load_commands, main, progress
from gpujitter.cli.top import (
    CHECKOUT,
    EXAMPLE_TRACE,
    TerminalOutput,
    make_feed,
    probe_output_aside,
    reading_shown,
)
from gpujitter.tui.app import GpujitterTop
from gpujitter.tui.feeds.embedded import EmbeddedFeed
from gpujitter.tui.feeds.replay import ReplayFeed
from gpujitter.tui.feeds.socket import SocketFeed
from tests.tui import node_stream
from tests.tui.conftest import DRILL_TRACE, STREAM, Daemon, python_as_nobody

S = 1_000_000_000


def parse(*argv: str) -> argparse.Namespace:
    return build_parser(load_commands()).parse_args(["top", *argv])


def test_picks_the_daemon_when_one_listens_else_runs_embedded(daemon: Daemon) -> None:
    assert isinstance(make_feed(parse("--socket", str(daemon.path))), EmbeddedFeed)
    daemon.start()
    assert isinstance(make_feed(parse("--socket", str(daemon.path))), SocketFeed)
    assert isinstance(make_feed(parse("--socket", str(daemon.path), "--embedded")), EmbeddedFeed)
    daemon.stop()
    waiting = make_feed(parse("--socket", str(daemon.path), "--daemon"))
    assert isinstance(waiting, SocketFeed)


def test_a_daemon_refusing_this_user_is_an_error_not_a_reason_to_run_embedded(
    closed_to_others: Path,
) -> None:
    """Permission denied on the socket: a daemon is there. `top` says who to ask (one line,
    exit 2) instead of running the probes this user cannot run; --daemon waits on it, its
    status line saying the same (test_feeds)."""
    done = python_as_nobody("-m", "gpujitter", "top", "--socket", str(closed_to_others))
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"gpujitter top: error: daemon at {closed_to_others} refuses this user (Permission "
        "denied): ask for the socket's group (socket.group) or run as root\n"
    )


def test_replay_starts_where_asked() -> None:
    feed = make_feed(parse("--replay", str(STREAM), "--at", "12:00:30", "--paused"))
    assert isinstance(feed, ReplayFeed) and not feed.playing
    assert feed.at_ns == node_stream.T0 + 30 * S
    end = make_feed(parse("--replay", str(STREAM), "--at", "end"))
    assert isinstance(end, ReplayFeed) and end.at_ns == end.end_ns and end.playing


# The progress line of the replay's first pass: a trace's share of its bytes and its events;
# an NDJSON file's records, counted (its reader does not say how far it is in the file).
SHOWN = re.compile(r"\rreading: (?:(\d+)% of [\d.]+[KM]iB, )?(\d+) events\x1b\[K")


def every_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress line refreshed at every event read, whatever the time."""
    monkeypatch.setattr(progress, "CHECK_EVERY", 1)
    monkeypatch.setattr(progress, "REFRESH_S", 0)


@pytest.mark.parametrize("path", [DRILL_TRACE, STREAM], ids=["trace", "ndjson"])
def test_the_first_pass_over_a_recording_shows_how_far_it_is(
    monkeypatch: pytest.MonkeyPatch, path: Path
) -> None:
    """A replay reads its whole recording before the app starts (tens of seconds for a
    day's): the terminal is told how far, on one line erased at the end; the feed is the
    same as without it."""
    every_event(monkeypatch)
    err = io.StringIO()
    args = parse("--replay", str(path), "--at", "end", "--paused")
    with reading_shown(shown=True, stream=err) as watch:
        feed = make_feed(args, watch)
        during = err.getvalue()
    shown = SHOWN.findall(during)
    assert len(shown) > 100 and SHOWN.sub("", during) == ""  # nothing else written
    assert [int(n) for _, n in shown] == list(range(1, len(shown) + 1))
    if path == DRILL_TRACE:
        shares = [int(share) for share, _ in shown]
        assert shares == sorted(shares) and shares[0] < 50 and shares[-1] == 100
    else:
        assert {share for share, _ in shown} == {""}
    assert err.getvalue() == during + "\r\x1b[K"  # erased once the reading is done
    plain = make_feed(args)
    assert isinstance(feed, ReplayFeed) and isinstance(plain, ReplayFeed)
    assert (feed.scene, feed.start_ns, feed.end_ns, feed.gaps, feed.at_ns, feed.playing) == (
        plain.scene, plain.start_ns, plain.end_ns, plain.gaps, plain.at_ns, plain.playing
    )  # fmt: skip


def test_the_progress_line_is_gone_before_the_app_takes_the_screen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`top --replay` on a terminal: the line is written while the recording is read, and
    erased before the app starts; nothing of it is written once the app draws."""
    every_event(monkeypatch)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    at_start: list[str] = []

    def run(app: GpujitterTop) -> None:  # the screen is not taken: what stderr held then
        at_start.append(capsys.readouterr().err)

    monkeypatch.setattr(GpujitterTop, "run", run)
    saved_audit = tmp_path / "audit.json"  # none run on this node
    saved_audit.write_text('{"findings": []}')
    assert main(["top", "--replay", str(DRILL_TRACE), "--paused", "--audit", str(saved_audit)]) == 0
    assert len(at_start) == 1 and SHOWN.findall(at_start[0])
    assert at_start[0].endswith("\r\x1b[K")
    assert capsys.readouterr().err == ""


def test_no_terminal_no_progress_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    every_event(monkeypatch)
    assert main(["top", "--replay", str(DRILL_TRACE)]) == 2
    assert capsys.readouterr().err == (
        "gpujitter top: error: top needs a terminal (for scripts: gpujitter top --json)\n"
    )


def run_top(*argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "gpujitter", "top", *argv]
    return subprocess.run(
        cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False
    )


def test_errors_are_one_line(tmp_path: Path) -> None:
    missing = run_top("--replay", str(tmp_path / "nope.gjtrace"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert "cannot read" in missing.stderr or "no such file" in missing.stderr
    no_tty = run_top("--replay", str(STREAM))
    assert no_tty.returncode == 2
    assert (
        no_tty.stderr
        == "gpujitter top: error: top needs a terminal (for scripts: gpujitter top --json)\n"
    )


def test_json_prints_the_daemons_snapshot_once_without_a_terminal(daemon: Daemon) -> None:
    """--json: what the view would show, as the daemon's snapshot (after its hello), one
    document; no daemon, a replay or the embedded probes are one line each."""
    daemon.start()
    proc = run_top("--json", "--socket", str(daemon.path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == daemon.snapshot
    daemon.stop()
    gone = run_top("--json", "--socket", str(daemon.path))
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1
    assert "no daemon answers at" in gone.stderr
    for mode in (["--replay", str(STREAM)], ["--embedded"]):
        refused = run_top("--json", *mode)
        assert refused.returncode == 2 and "gpujitter report --json" in refused.stderr


def test_the_last_message_the_probes_left_on_stderr_is_shown_inert(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """bcc's and clang's messages quote file and process names: the one line top prints
    afterwards shows them escaped (and a byte that is not UTF-8 as \\xNN)."""
    with probe_output_aside():
        os.write(2, b"clang: /tmp/\x1b]0;pwned\x07/\xff.h: no such file\n")
    err = capfd.readouterr().err
    assert err == (
        "gpujitter top: last message on stderr: clang: /tmp/\\x1b]0;pwned\\x07/\\xff.h: "
        "no such file\n"
    )


def terminal_output(master: int, done: Callable[[bytes], bool]) -> bytes:
    """What the other side of a pseudo-terminal writes until `done(all of it)`, it closes its
    side or 30 s pass."""
    got, deadline = b"", time.monotonic() + 30
    while not done(got) and time.monotonic() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            try:
                got += os.read(master, 1 << 16)
            except OSError:  # EIO: every descriptor of its side is closed
                break
    return got


def stopped_on_a_terminal(stop: signal.Signals | None) -> tuple[int, bytes]:
    """`gpujitter top --replay` on a pseudo-terminal of its own, sent `stop` (None: `q` typed)
    once it has drawn: its exit status, and what it wrote from then on."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    cmd = [sys.executable, "-m", "gpujitter", "top", "--replay", str(STREAM)]
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    try:
        assert b"GPU" in terminal_output(master, lambda got: b"GPU" in got)
        if stop is None:
            os.write(master, b"q")
        else:
            proc.send_signal(stop)
        after = terminal_output(master, lambda _: False)
        return proc.wait(timeout=10), after
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    ("stop", "code"),
    [(None, 0), (signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)],
    ids=["q", "sigterm", "sighup", "sigint"],
)
def test_a_signal_quits_as_q_does_and_gives_the_terminal_back(
    stop: signal.Signals | None, code: int
) -> None:
    """SIGTERM (systemd, `timeout`) and SIGHUP killed the app with the terminal left on the
    alternate screen, tracking the mouse, its cursor hidden; SIGINT exited 0."""
    status, after = stopped_on_a_terminal(stop)
    assert status == code
    for restored in (b"\x1b[?1049l", b"\x1b[?1000l", b"\x1b[?25h"):  # screen, mouse, cursor
        assert restored in after
    assert b"Traceback" not in after


@pytest.mark.parametrize("how", ["closed", "holder killed"])
def test_a_terminal_gone_without_a_hangup_signal_ends_it(how: str) -> None:
    """The pseudo-terminal's master closed (or its holder killed with SIGKILL) where the
    terminal is not the app's controlling one (its own session, as `setsid`): no SIGHUP comes.
    The app stayed at a full CPU for ever, its input thread reading end-of-file in a loop and
    its loop blocked behind a dead output thread; it quits now as on SIGHUP, within 2 s. The
    example plays on (32 s of a real run), so the app is drawing when its terminal goes."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    cmd = [sys.executable, "-m", "gpujitter", "top", "--replay", str(CHECKOUT / EXAMPLE_TRACE)]
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    holder = None
    try:
        assert b"GPU" in terminal_output(master, lambda got: b"GPU" in got)
        playing = time.monotonic() + 1  # it plays for a second, drawing as it goes
        terminal_output(master, lambda _: time.monotonic() > playing)
        if how == "holder killed":
            holder = subprocess.Popen(["sleep", "60"], pass_fds=[master])
        os.close(master)
        master = -1
        if holder is not None:
            holder.kill()
            holder.wait()
        gone = time.monotonic()
        assert proc.wait(timeout=5) == 129
        assert time.monotonic() - gone < 2
    finally:
        if master >= 0:
            os.close(master)
        for child in (proc, holder):
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()


def test_output_that_fails_is_said_once_and_dropped_after() -> None:
    """Textual's output thread died at the first write to a terminal that had gone (EIO), and
    the app's loop then blocked for ever on the writes queued for it."""
    read, write = os.pipe()
    os.close(read)  # writes fail with EPIPE, as they fail with EIO on a hung-up terminal
    said: list[str] = []
    out = TerminalOutput(os.fdopen(write, "w"))
    out.gone = lambda: said.append("gone")
    try:
        for text in ("frame", "frame"):
            assert out.write(text) == len(text)
            out.flush()
    finally:
        with contextlib.suppress(OSError):
            out.file.close()
    assert out.failed
    assert said == ["gone"]
