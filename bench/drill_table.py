"""The accuracy table of docs/accuracy.md from drill scores (`gpujitter drill --json`
outputs, one file per scenario): one row per scenario, in the order given.

    python -m bench.drill_table out/drills/*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

TARGETS = ("found_all", "top_cause", "attributed", "no_false_gaps", "no_self_inflicted", "culprit")
HEADER = (
    "| scenario | stalls found | top cause right | injected cause: attributed vs truth "
    "| false gaps | self-inflicted | targets |\n|---|---|---|---|---|---|---|"
)


def false_gaps(count: int, on_job_idle: int) -> str:
    """A false-gap count, with those on idle the real job measured itself (bench/real_job.py)."""
    return f"{count} ({on_job_idle} on the job's own idle)" if on_job_idle else f"{count}"


def row(r: dict[str, Any]) -> str:
    # Scores from before gpujitter counted them have no self-inflicted gaps to show.
    own = r.get("self_inflicted", "—")
    missed = [t for t in TARGETS if not r["targets"].get(t, True)]
    if not r["injected"]:
        return (
            f"| {r['scenario']} | — | — | — | {r['false_gaps']} in {r['window_s']:.0f} s | "
            f"{own} | {'met' if not missed else 'missed: ' + ', '.join(missed)} |"
        )
    false = false_gaps(r["false_gaps"], r.get("false_on_job_idle", 0))
    top = sorted({s["top_cause"] or "not found" for s in r["stalls"]})
    error = "—" if r["error_pct"] is None else f"{r['error_pct']:+.1f} %"
    return (
        f"| {r['scenario']} | {r['found']}/{r['injected']} "
        f"({r['injected_ms'] / r['injected']:.1f} ms each) | {r['cause']}: "
        f"{r['top_right']}/{r['injected']} (top: {', '.join(top)}) | "
        f"{r['attributed_ms']:.1f} of {r['truth_ms']:.1f} ms ({r['truth']}), {error} | "
        f"{false} | {own} | {'met' if not missed else 'missed: ' + ', '.join(missed)} |"
    )


def main() -> None:
    records = []
    for path in map(Path, sys.argv[1:]):
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            print(f"{path}: no score (the drill failed or was stopped: see its .log)")
    print(HEADER)
    for r in records:
        print(row(r))


if __name__ == "__main__":
    main()
