"""What a subcommand declares: its name, help, usage examples, arguments and entry point."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    summary: str  # one line, shown in `gpujitter --help`
    description: str  # paragraph(s) at the top of `gpujitter NAME --help`
    examples: str  # shown under "examples:"; one command per line, with a comment above
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    json_flag: bool = True  # every command that prints results offers --json
    # It writes a file that a kill must not leave half written: SIGTERM ends it as Ctrl-C
    # does (its cleanup runs), with exit status 143.
    writes_files: bool = False

    def install(self, sub: argparse._SubParsersAction) -> None:
        parser = sub.add_parser(
            self.name,
            help=self.summary,
            description=textwrap.dedent(self.description).strip(),
            epilog="examples:\n" + textwrap.indent(textwrap.dedent(self.examples).strip(), "  "),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        if self.json_flag:
            parser.add_argument(
                "--json", action="store_true", help="print machine-readable JSON instead of text"
            )
        self.add_arguments(parser)
        parser.set_defaults(run=self.run, writes_files=self.writes_files)
