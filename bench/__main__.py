"""List the benchmarks in bench/: one line each (from its docstring or header comment) and the
command that runs it (the command line its docstring shows). Nothing is run or imported.

    .venv/bin/python -m bench        (`make bench` runs the headline one, bench.default_set)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
# A line of a docstring that is a command to type, not prose.
COMMAND = re.compile(r"^(flock |sudo |(\S*/)?python3?( |$)|tools/\S+\.sh )")


def shell_header(path: Path) -> str:
    """The comment block under a script's shebang, without the '#'s."""
    lines = []
    for line in path.read_text().splitlines()[1:]:
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(lines)


def first_clause(text: str) -> str:
    """The docstring's opening up to its first ':', ';' or '.' outside brackets and quotes."""
    flat = " ".join(text.split("\n\n")[0].split())
    depth = 0
    quoted = ""
    for i, ch in enumerate(flat):
        if quoted:
            quoted = "" if ch == quoted else quoted
        elif ch in '`"':
            quoted = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch in ":;." and depth == 0 and flat[i + 1 : i + 2] in ("", " "):
            return flat[:i]
    return flat


def command_of(text: str) -> str:
    for line in text.splitlines():
        if COMMAND.match(line.strip()):
            return line.strip()
    return "no command of its own: the benchmarks above start it"


def entries() -> list[tuple[str, str, str]]:
    out = []
    for path in sorted(HERE.glob("*.py")) + sorted(HERE.glob("*.sh")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        if path.suffix == ".py":
            text = ast.get_docstring(ast.parse(path.read_text())) or ""
        else:
            text = shell_header(path)
        out.append((path.name, first_clause(text), command_of(text)))
    return out


def main() -> int:
    for name, summary, command in entries():
        print(f"{name}: {summary}\n    {command}")
    print(
        "\nThe flock ones attach probes: root, no GPU, and the machine to themselves as far as"
        "\npossible (the lock keeps them from overlapping). `make bench` runs default_set.py, the"
        "\nheadline overhead figure. Results and method: docs/performance.md, docs/gpu.md."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
