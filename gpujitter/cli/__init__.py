"""The `gpujitter` console script: one module per subcommand, listed in COMMANDS.

Each subcommand module exposes `COMMAND`, a `Command`. Heavy imports (bcc, textual, NVML)
happen inside `run`, so `gpujitter --help` stays instant and a missing optional part only
breaks the subcommand that needs it. A command line that names its command loads that
command's module alone: several import the daemon's modules, and `gpujitter run` starts its
probes' compile before it imports them (daemon/service/head_start.py).
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from gpujitter import __version__
from gpujitter.cli.command import Command
from gpujitter.errors import GpujitterError
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
    (argparse prints its usage block first): what is wrong, and where the help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {printable(message)} (see {self.prog} --help)\n")


def build_parser(commands: Sequence[Command]) -> argparse.ArgumentParser:
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


def main(argv: Sequence[str] | None = None) -> int:
    commands = load_commands(named_command(sys.argv[1:] if argv is None else argv))
    args = build_parser(commands).parse_args(argv)
    try:
        return int(args.run(args))
    except GpujitterError as err:
        # An error can quote a file's or a process's text: shown inert, like all output.
        print(f"gpujitter {args.command}: error: {printable(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `gpujitter probe sched | head`: the reader left; not an error worth a traceback.
        sys.stderr.close()
        return 0
    except OSError as err:
        # The output's device full or failing (`report > /dev/full`): the system's words, on
        # one line, and what is still buffered for it dropped, so that the exit does not fail
        # writing it a second time. Any other OSError is a fault (entry()).
        if err.filename is not None or err.errno not in OUTPUT_ERRNOS:
            raise
        _drop_stdout()
        print(f"gpujitter {args.command}: error: {err.strerror}", file=sys.stderr)
        return 2


OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)


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
