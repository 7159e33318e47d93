"""Benchmarks (`python -m bench` lists them). A bench started with GJ_BENCH_TREE=DIR in its
environment imports the gpujitter package laid out in DIR (another tree: the rounds of a
bench's --before) instead of this checkout's."""

import json
import os
import subprocess
import sys
from typing import Any

if _tree := os.environ.get("GJ_BENCH_TREE"):
    # Ahead of an editable install's finder, which would otherwise win over the path.
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
    sys.path.insert(0, _tree)


def alternated(module: str, argv: list[str], before: str, rounds: int) -> list[tuple[str, Any]]:
    """`python -m MODULE --json ARGV` in a fresh process `rounds` times, and as many times
    with the package laid out in `before` (GJ_BENCH_TREE; none when empty), in turns: before,
    this, this, before, ... Each run's JSON with its tree ("this", or `before`)."""
    trees = [before, ""] if before else [""]
    order = [t for r in range(rounds) for t in (trees if r % 2 == 0 else trees[::-1])]
    safe_path = ["-P"] if sys.flags.safe_path else []  # as this process was started
    out = []
    for tree in order:
        env = {**os.environ, "GJ_BENCH_TREE": tree} if tree else os.environ
        done = subprocess.run([sys.executable, *safe_path, "-m", module, "--json", *argv],
                              env=env, stdout=subprocess.PIPE, text=True, check=True)  # fmt: skip
        out.append((tree or "this", json.loads(done.stdout)))
    return out
