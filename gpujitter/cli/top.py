"""`gpujitter top`: the live TUI. Connects to the daemon's socket when one listens; otherwise
runs the probes in-process (embedded); with --replay, plays a recording through the same
views."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import select
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from gpujitter.cli.command import Command
from gpujitter.cli.options import (
    add_socket_arg,
    add_topology_args,
    add_watch_args,
    path_arg,
    socket_from_args,
    topology_from_args,
    watch_from_args,
)
from gpujitter.cli.progress import Progress
from gpujitter.errors import GpujitterError
from gpujitter.text import printable

if TYPE_CHECKING:
    from gpujitter.tui.app import Offer
    from gpujitter.tui.feeds import Feed
    from gpujitter.tui.feeds.replay import Watch

# The recording a first look replays (from a real H200 run), relative to the checkout; the
# live view offers it only where the file is there.
EXAMPLE_TRACE = Path("examples/h200-training.gjtrace")
CHECKOUT = Path(__file__).resolve().parents[2]


def speed(text: str) -> float:
    """A playback speed: 0 or less would never move (the replay froze)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1000:
        raise argparse.ArgumentTypeError(f"want a speed above 0 and at most 1000, not {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_socket_arg(p, "read when a daemon listens there")
    p.add_argument(
        "--probes",
        metavar="LIST",
        help="embedded: probes to run, comma-separated; +NAME adds one to the default set "
        "(--probes sched,irq runs those two)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--replay",
        type=path_arg,
        metavar="TRACE",
        help="play a recording: a trace (file or directory from `gpujitter record`) or an "
        "NDJSON file of stream records (a captured socket stream, the attribution log)",
    )
    mode.add_argument(
        "--embedded",
        action="store_true",
        help="run the probes in this process even if a daemon listens",
    )
    mode.add_argument(
        "--daemon",
        action="store_true",
        help="only show the daemon's stream: wait for it instead of running the probes here",
    )
    p.add_argument(
        "--at",
        default="start",
        metavar="WHERE",
        help="replay: where to start (start, end, or HH:MM:SS, +TIME, N%%; default start)",
    )
    p.add_argument("--paused", action="store_true", help="replay: start paused")
    p.add_argument("--speed", type=speed, default=1.0,
                   help="replay: playback speed, above 0 (default 1; 0.5: half)")  # fmt: skip
    p.add_argument(
        "--audit",
        type=path_arg,
        metavar="FILE",
        help="show this `gpujitter audit --json` output in the Audit view instead of auditing "
        "this node (e.g. the audit of the node a trace was recorded on)",
    )
    add_watch_args(p)
    add_topology_args(p)


# What only live probes (embedded) or a daemon use: beside --replay, refused.
LIVE_ONLY = ("probes", "socket", "topology_override", "pid", "comm", "cgroup", "pod", "slurm_job")
# What shapes the view or its own probes: beside --json (the daemon's snapshot), refused.
VIEW_ONLY = ("probes", "topology_override", "pid", "comm", "cgroup", "pod", "slurm_job", "audit")


def replay_options(args: argparse.Namespace) -> list[str]:
    """The options given that steer a replay's playback (their defaults tell nothing)."""
    return (["--at"] * (args.at != "start") + ["--paused"] * args.paused
            + ["--speed"] * (args.speed != 1.0))  # fmt: skip


def make_feed(args: argparse.Namespace, watch: Watch | None = None) -> Feed:
    """The feed `top` reads; a replay's first pass over its recording (before the app
    starts) goes through `watch` (see reading_shown)."""
    from gpujitter.probes import registry
    from gpujitter.tui.feeds.embedded import EmbeddedFeed
    from gpujitter.tui.feeds.replay import ReplayFeed
    from gpujitter.tui.feeds.socket import SocketFeed, daemon_listening

    if args.replay is not None:
        live = [f"--{name.replace('_', '-')}" for name in LIVE_ONLY if getattr(args, name)]
        if live:  # they shape what probes see here; a recording's were chosen when it was made
            raise GpujitterError(f"--replay plays a recording: {', '.join(live)} would do "
                                 "nothing with it")  # fmt: skip
        return replay_feed(args, ReplayFeed if watch is None else partial(ReplayFeed, watch=watch))
    playback = replay_options(args)
    if playback:  # taken, they did nothing: the live view has no playback to steer
        raise GpujitterError(f"{', '.join(playback)} would do nothing without --replay (a "
                             "recording's playback)")  # fmt: skip
    path = socket_from_args(args)
    if args.daemon or (not args.embedded and daemon_listening(path)):
        return SocketFeed(path)
    names = registry.select(args.probes.split(",") if args.probes else ())
    return EmbeddedFeed(
        names,
        topology=topology_from_args(args),
        watch=watch_from_args(args),
    )


def replay_feed(args: argparse.Namespace, cls: Any) -> Feed:
    where = args.at
    if where in ("start", "end"):
        return cls(args.replay, at=where, playing=not args.paused, speed=args.speed)
    feed = cls(args.replay, at="start", playing=not args.paused, speed=args.speed)
    from gpujitter.tui.app import seek_target
    from gpujitter.tui.inbox import ReplayPosition
    from gpujitter.tui.model import NodeModel

    model = NodeModel()
    model.apply_all(feed.scene)
    pos = ReplayPosition(feed.start_ns, feed.start_ns, feed.end_ns, False, 1.0)
    feed.at_ns = seek_target(where, model.clock, pos)
    return feed


@contextlib.contextmanager
def reading_shown(shown: bool | None = None, stream: TextIO | None = None) -> Iterator[Watch]:
    """A replay reads its whole recording once before the app starts (where it starts and
    ends, its gaps): minutes of a busy node's day are seconds to read, a day's tens of
    seconds, of a terminal that says nothing. Yields a replay's `watch`, which shows how far
    that reading is on one line of standard error while it is a terminal (the offline
    commands' progress line), erased when the reading ends, before the app takes the
    screen. `shown`, `stream`: as Progress's."""
    with Progress(0, shown=shown, stream=stream) as progress:

        def watch(
            items: Iterable[Any], position: Callable[[], int | None], size: int
        ) -> Iterable[Any]:
            progress.total = size  # known once the recording is open
            return progress.events(items, position)

        yield watch


# A kill (systemd, `timeout`), the terminal's hangup, an interrupt sent by kill (Ctrl-C at the
# keyboard is a key to the app). SIGTERM and SIGHUP killed the process with the terminal left
# in the app's modes (alternate screen, mouse tracking, hidden cursor); SIGINT exited 0.
QUIT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How often the app looks whether its terminal is still there. One that went away without a
# SIGHUP reaching the app (the master side closed where the terminal is not the app's
# controlling one: a harness killed, `setsid`) left it at a full CPU for ever: its input
# thread read end-of-file in a loop, and its output thread died on EIO, after which the
# screen's next writes blocked the app's loop.
HANGUP_CHECK_S = 0.5
# What poll() reports of a terminal that hung up (a closed fd: POLLNVAL), asked or not.
HUNG_UP = select.POLLHUP | select.POLLERR | select.POLLNVAL


def hung_up(fds: Iterable[int]) -> bool:
    """Whether any of these descriptors' terminal hung up, or the descriptor is closed."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, 0)
    return any(events & HUNG_UP for _, events in poller.poll(0))


class TerminalOutput:
    """The app's output to its terminal, as Textual's writer thread uses it: once a write or
    flush fails (EIO: the terminal hung up), `gone` is called once and what follows is
    dropped, where the failure had ended that thread and the app then waited for it for
    ever at its next frames."""

    def __init__(self, file: TextIO) -> None:
        self.file = file
        self.failed = False
        self.gone: Callable[[], None] = lambda: None

    def write(self, text: str) -> int:
        if not self.failed:
            try:
                self.file.write(text)
            except OSError:
                self._failed()
        return len(text)

    def flush(self) -> None:
        if not self.failed:
            try:
                self.file.flush()
            except OSError:
                self._failed()

    def fileno(self) -> int:
        return self.file.fileno()

    def isatty(self) -> bool:
        return True

    def _failed(self) -> None:
        self.failed = True
        self.gone()


@contextlib.contextmanager
def probe_output_aside() -> Iterator[type[Any]]:
    """Yield a Textual driver that draws on a duplicate of the terminal, and point fd 2 at a
    file while the app runs: bcc and clang write to fd 2 (the probes capture it while they
    compile), which must neither tear the screen nor mix the screen's bytes into a probe's
    error text. What was said there is summed up in one line afterwards. The driver ends
    the app on QUIT_SIGNALS as `q` does, its return code 128 + the signal's number (the
    status a shell reports for a death by it), and as on SIGHUP when its terminal is gone
    though no signal came (HANGUP_CHECK_S)."""
    from textual.drivers.linux_driver import LinuxDriver

    terminal = TerminalOutput(os.fdopen(os.dup(2), "w"))

    class TerminalDriver(LinuxDriver):
        def __init__(self, app: Any, **kwargs: Any) -> None:
            super().__init__(app, **kwargs)
            self._file = terminal  # type: ignore[assignment]  # what Textual uses of a file
            terminal.gone = self._hung_up_from_thread
            self._hangup_check: asyncio.TimerHandle | None = None

        def start_application_mode(self) -> None:
            loop = asyncio.get_running_loop()
            for signum in QUIT_SIGNALS:
                loop.add_signal_handler(signum, partial(self._app.exit, return_code=128 + signum))
            super().start_application_mode()
            self._check_terminal()

        def stop_application_mode(self) -> None:
            if self._hangup_check is not None:
                self._hangup_check.cancel()
                self._hangup_check = None
            super().stop_application_mode()
            for signum in QUIT_SIGNALS:
                asyncio.get_running_loop().remove_signal_handler(signum)

        def _check_terminal(self) -> None:
            if hung_up((self.fileno, terminal.fileno())):
                terminal.failed = True  # nothing more is written there, nor said at the end
                self._hung_up()
            else:
                self._hangup_check = self._loop.call_later(HANGUP_CHECK_S, self._check_terminal)

        def _hung_up(self) -> None:
            self._app.exit(return_code=128 + signal.SIGHUP)

        def _hung_up_from_thread(self) -> None:  # the writer thread's
            with contextlib.suppress(RuntimeError):  # the loop closed: the app has ended
                self._loop.call_soon_threadsafe(self._hung_up)

    saved = os.dup(2)
    with tempfile.TemporaryFile() as aside:
        os.dup2(aside.fileno(), 2)
        try:
            yield TerminalDriver
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            with contextlib.suppress(OSError):  # a hangup took the terminal: its flush fails
                terminal.file.close()
            aside.seek(0)
            said = aside.read().decode(errors="backslashreplace").strip().splitlines()
            if said and not terminal.failed:  # else there is no terminal to say it on
                last = printable(said[-1])
                print(f"gpujitter top: last message on stderr: {last}", file=sys.stderr)


def example_offer(path: Path = CHECKOUT / EXAMPLE_TRACE) -> Offer | None:
    """The example recording as an offer of the live view, if it is there."""
    from gpujitter.tui.app import Offer
    from gpujitter.tui.feeds.replay import ReplayFeed

    if not path.is_file():
        return None
    shown = EXAMPLE_TRACE if path == CHECKOUT / EXAMPLE_TRACE else path
    return Offer(f"gpujitter top --replay {shown}", partial(ReplayFeed, path))


def check_saved_audit(path: Path) -> None:
    """GpujitterError unless `path` reads as `gpujitter audit --json`'s output: said at the
    start, as a bad --replay is; the Audit view of an app already open said it, exit 0."""
    from gpujitter.tui.audit import load_file

    try:
        error = load_file(path).error
    except GpujitterError as err:
        raise GpujitterError(f"--audit: {err}") from None
    if error:
        raise GpujitterError(f"--audit: {path}: {error}")


SNAPSHOT_WAIT_S = 5.0  # a daemon answers a connection with its snapshot at once


def daemon_snapshot(path: Path) -> dict[str, Any]:
    """The snapshot a daemon sends each client as it connects (daemon/sinks/stream.py): its
    GPUs, recent gaps and attributions, CPUs, probes and own status, what the view shows."""
    from gpujitter.daemon.sinks.stream import first_records

    try:
        got = first_records(path, ["snapshot"], SNAPSHOT_WAIT_S)
    except OSError as err:
        raise GpujitterError(
            f"no daemon answers at {path} ({err.strerror or err}): --json prints a running "
            "daemon's snapshot (a recording's: gpujitter report --json)"
        ) from None
    if "snapshot" not in got:
        raise GpujitterError(
            f"the daemon at {path} sent no snapshot within {SNAPSHOT_WAIT_S:.0f} s"
        )
    return got["snapshot"]


def run(args: argparse.Namespace) -> int:
    from gpujitter.tui import audit
    from gpujitter.tui.app import GpujitterTop

    if args.json:  # for scripts and monitoring: one look, the daemon's, no terminal needed
        if args.replay is not None or args.embedded:
            raise GpujitterError(
                "--json prints the daemon's snapshot; for a recording: gpujitter report "
                "--json, for the probes in this process: gpujitter probe --json"
            )
        idle = [f"--{name.replace('_', '-')}" for name in VIEW_ONLY if getattr(args, name)]
        idle += replay_options(args)
        if idle:  # a script that passes them expects them to count
            raise GpujitterError(
                f"--json prints the daemon's snapshot as it is: {', '.join(idle)} would do "
                "nothing with it"
            )
        from gpujitter.cli.output import print_json

        print_json(daemon_snapshot(socket_from_args(args)))
        return 0
    if args.audit is not None:
        check_saved_audit(args.audit)
    with reading_shown() as watch:
        feed = make_feed(args, watch)  # bad input is reported first, terminal or not
    if not sys.stdin.isatty() or not sys.stderr.isatty():
        raise GpujitterError("top needs a terminal (for scripts: gpujitter top --json)")
    loader = audit.run_audit if args.audit is None else partial(audit.load_file, args.audit)
    with probe_output_aside() as driver:
        app = GpujitterTop(feed, audit=loader, example=example_offer(), driver_class=driver)
        app.run()
    # Textual prints a crash's traceback itself and sets 1; the CLI's code for it is 70
    # (internal error), as for any command, so that a wrapper can tell it from a clean quit.
    code = app.return_code or 0
    return 70 if code == 1 else code


COMMAND = Command(
    name="top",
    summary="the live view: GPUs, idle gaps and their causes, CPUs, the node's audit",
    description="""
        Open the live view of this node: per GPU its utilisation and power with idle gaps
        marked; every gap with its top cause, and on enter its breakdown (causes in ms and
        %, the evidence, the remedy); per CPU its NUMA node, interrupt load, idle states
        and the watched threads there (remote-node placements in red); the node's tuning
        audit. The status line shows the data feed, probe health, lost events, the
        daemon's own CPU and dropped records.

        Connects to the daemon's socket when a daemon listens, and reconnects when it
        restarts; with no daemon it runs the probes itself (needs root; without, it shows
        the kernel's interrupt and idle counters). --replay plays a recording through the
        same views: p play/pause, n next gap, . step, g seek. --json prints the daemon's
        snapshot of all that once (GPUs, recent gaps and attributions, CPUs, probes, its
        status) and exits.
    """,
    examples="""
        # this node, live (the daemon's stream, or the probes in-process)
        gpujitter top
        # only processes named python*, probes in-process
        gpujitter top --embedded --comm 'python*'
        # a recorded trace, from its end, paused
        gpujitter top --replay /var/lib/gpujitter/traces --at end --paused
        # the attribution log, with the audit of the node it came from
        gpujitter top --replay attributions.jsonl --audit node-audit.json
        # what the view shows, once, as JSON (the daemon's snapshot; no terminal needed)
        gpujitter top --json | jq '.gaps[-1]'
    """,
    add_arguments=add_arguments,
    run=run,
)
