"""The `gpujitter` console script: one module per subcommand, listed in COMMANDS.

Each subcommand module exposes `COMMAND`, a `Command`. Heavy imports (bcc, textual, NVML)
happen inside `run`, so `gpujitter --help` stays instant and a missing optional part only
breaks the subcommand that needs it. A command line that names its command loads that
command's module alone: several import the daemon's modules, and `gpujitter run` starts its
probes' compile before it imports them (daemon/service/head_start.py).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import importlib
import io
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from gpujitter import __version__
from gpujitter.cli.command import Command
from gpujitter.errors import GpujitterError
from gpujitter.signals import RELOAD_SIGNALS, STOP_SIGNALS, STRAY_SIGNALS, stop_while_starting
from gpujitter.text import printable

# Order is the order `gpujitter --help` lists them in.
COMMANDS = (
    "top", "run", "doctor", "audit", "topo", "gpus", "probe", "gaps", "record", "report",
    "export", "trace", "drill",
)  # fmt: skip


def load_commands(names: Sequence[str] = COMMANDS) -> list[Command]:
    return [importlib.import_module(f"gpujitter.cli.{name}").COMMAND for name in names]


def named_command(argv: Sequence[str]) -> list[str]:
    """[the command] where `argv` names one, else every command (help, a mistake): the
    options before it take no value, so the first word that is not one is the command."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return [first] if first in COMMANDS else list(COMMANDS)


class Parser(argparse.ArgumentParser):
    """argparse's, but a mistake on the command line is one line, as every other error is
    (argparse prints its usage block first): what is wrong, and where the help is. An
    option the command does not have is told by the command's parser, as its other
    mistakes are (argparse leaves it to the top one: `gpujitter: error: ...`)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {printable(message)} (see {self.prog} --help)\n")

    def parse_command_line(self, argv: Sequence[str] | None) -> argparse.Namespace:
        parsed, extra = self.parse_known_args(argv)
        if extra:
            command = self.commands.get(getattr(parsed, "command", None) or "", self)
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    @property
    def commands(self) -> dict[str, argparse.ArgumentParser]:
        """The subcommands' parsers by name ({} for a parser without)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def build_parser(commands: Sequence[Command]) -> Parser:
    parser = Parser(
        prog="gpujitter",
        description="Find out why the GPUs of this node sit idle: host jitter probes (eBPF), "
        "GPU idle-gap detection and attribution of each gap to its causes.",
        epilog="Run `gpujitter COMMAND --help` for a command's options and examples.",
    )
    parser.add_argument("--version", action="version", version=f"gpujitter {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands:
        command.install(sub)
    return parser


# Commands whose SIGHUP means "reload" once they run: a hangup during their import and start
# (before the daemon's handler is in place) is ignored, not the default's death; so are the
# other signals the daemon takes (SIGUSR1, the strays). SIGTERM and SIGINT stop them as the
# runtime does before its probes are attached: one line and exit 130, not the default's
# death without a word (systemctl stop during the seconds of the probes' compile).
RELOADS = frozenset({"run"})


def main(argv: Sequence[str] | None = None) -> int:
    _standard_streams()
    named = named_command(sys.argv[1:] if argv is None else argv)
    if named[0] in RELOADS and len(named) == 1:
        for signum in (*RELOAD_SIGNALS, *STRAY_SIGNALS):
            signal.signal(signum, signal.SIG_IGN)
        for signum in STOP_SIGNALS:
            signal.signal(signum, stop_while_starting)
    parser = build_parser(load_commands(named))
    name = f"gpujitter {named[0]}" if len(named) == 1 else "gpujitter"  # (`COMMAND --help`)
    try:
        try:
            args = parser.parse_command_line(argv)
        except SystemExit:
            # --help, --version or a usage error, written by argparse: its output flushed
            # here, where a closed pipe or a full disk is handled, not at the interpreter's exit
            sys.stdout.flush()
            raise
        name = f"gpujitter {args.command}"
        with _interrupted_by_sigterm(args.writes_files):
            code = int(args.run(args))
        # A short text output still sits in the buffer: written now, for the same reason.
        sys.stdout.flush()
        return code
    except GpujitterError as err:
        # An error can quote a file's or a process's text: shown inert, like all output.
        print(f"{name}: error: {printable(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        return 143 if isinstance(stop, Terminated) else 130
    except RuntimeError as err:
        # Python's words when the kernel gives no thread (address space, process count): the
        # node's limits on this process, not a fault of the command.
        if "can't start new thread" not in str(err):
            raise
        print(f"{name}: error: cannot start a thread: {THREAD_LIMITS}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `gpujitter probe sched | head`: the reader left; not an error worth a word.
        _drop_stdout()
        return 0
    except OSError as err:
        # The output's device full or failing (`report > /dev/full`), or closed (`>&-`): the
        # system's words, on one line, and what is still buffered for it dropped, so that
        # the exit does not fail writing it a second time. Any other OSError is a fault
        # (entry()).
        if err.filename is not None or err.errno not in OUTPUT_ERRNOS:
            raise
        _drop_stdout()
        print(f"{name}: error: standard output: {err.strerror}", file=sys.stderr)
        return 2


THREAD_LIMITS = "the process's limits are too tight (ulimit -v, -u; LimitAS=, TasksMax=)"
OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EBADF)


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as Ctrl-C is (`timeout 60 gpujitter export ...`): what a command
    cleans up on an interrupt, it cleans up on a kill too."""


@contextlib.contextmanager
def _interrupted_by_sigterm(wanted: bool) -> Iterator[None]:
    if not wanted:
        yield
        return

    def terminated(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class _Closed(io.TextIOBase):
    """Standard output that the caller closed (`gpujitter topo >&-`), where Python leaves
    None: print() takes that as "write nowhere" (the output lost, the command a success) and
    JSON output as an AttributeError. Here writing fails as writing to a closed descriptor
    does."""

    def writable(self) -> bool:
        return True

    def write(self, text: object) -> int:
        raise OSError(errno.EBADF, "closed")

    @property
    def buffer(self) -> _Closed:  # JSON is written as bytes, to the text stream's buffer
        return self


def _standard_streams() -> None:
    """Streams every command can write to. Closed standard error (None) becomes /dev/null:
    argparse fails on None, and print() would send the message to standard output. Text
    that the output's encoding cannot hold (PYTHONIOENCODING=ascii, a latin-1 terminal: a
    µ or a ± of ours, an undecodable byte of a file's name) is escaped, not an error."""
    # A closed descriptor 0, 1 or 2 goes to /dev/null before anything opens a file: else the
    # first file opened (a trace, a log, a BPF map) would take its number, and a C library's
    # write to "standard error" (bcc's and libbpf's warnings) would land in it.
    for fd, mode in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
        except OSError:
            devnull = os.open(os.devnull, mode)  # the lowest free number: `fd` itself
            if devnull != fd:
                os.dup2(devnull, fd)
                os.close(devnull)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115  # the process's, to its end
    if sys.stdout is None:
        sys.stdout = _Closed()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def _drop_stdout() -> None:
    try:
        sys.stdout.flush()
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def entry() -> NoReturn:
    """The process's entry (the console script, `python -m gpujitter`): main(), then the
    interpreter's exit without its last collections of the whole heap. Those took 0.55-0.7 s
    of a daemon's stop after a few minutes beside a busy job on the development VM, and more
    the longer it ran (3.6 s after 17 minutes), against 2 s for the whole stop; frozen, the
    exit took 0.18 s (docs/performance.md, "Start and stop"). Everything the command wrote
    is closed by then; what a collection would still free, the process's end frees.

    An exception no command foresaw (input no check caught) ends the process with one line
    and EX_SOFTWARE, not a traceback; GPUJITTER_DEBUG=1 lets the traceback through."""
    try:
        code = main()
    except KeyboardInterrupt:  # Ctrl-C before a command runs (its module still importing)
        code = 130
    except Exception as err:
        if os.environ.get("GPUJITTER_DEBUG"):
            raise
        command = named_command(sys.argv[1:])
        name = f"gpujitter {command[0]}" if len(command) == 1 else "gpujitter"
        print(
            f"{name}: internal error: {type(err).__name__}: {printable(str(err))[:300]} "
            "(GPUJITTER_DEBUG=1 shows where; please report it)",
            file=sys.stderr,
        )
        code = 70  # EX_SOFTWARE
    gc.freeze()
    sys.exit(code)
