"""`gpujitter top`'s command line: which feed it picks, where a replay starts, and the
one-line errors (the app itself is tested through Pilot)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpujitter.cli import build_parser, load_commands
from gpujitter.cli.top import make_feed, probe_output_aside
from gpujitter.tui.feeds.embedded import EmbeddedFeed
from gpujitter.tui.feeds.replay import ReplayFeed
from gpujitter.tui.feeds.socket import SocketFeed
from tests.tui import node_stream
from tests.tui.conftest import STREAM, Daemon, python_as_nobody

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
