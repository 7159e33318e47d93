"""The tables of the real training job's runs (bench/real_job.py summaries) in the formats of
docs/accuracy.md ("A real training job") and docs/performance.md ("Beside a real training
job"): the job, each attach of the daemon with its false gaps, each injected scenario's
score (the drills' row format, bench/drill_table.py), the cost rounds.

    python3 -m bench.real_job_table realjob-accuracy.json [realjob-cost.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.drill_table import HEADER as SCENARIO_HEADER
from bench.drill_table import false_gaps
from bench.drill_table import row as drill_row


def job_line(job: dict[str, Any]) -> str:
    bound = "GPU-bound" if job["gpu_bound"] else "host-bound"
    return (
        f"Job: {job['params'] / 1e6:.1f}M parameters ({job['layers']} layers, d_model "
        f"{job['d_model']}, {job['heads']} heads, vocab {job['vocab']}), batch {job['batch']} x "
        f"{job['seq']}, {job['workers']} DataLoader workers; {job['step_ms']:.1f} ms a step "
        f"(host {job['host_ms']:.1f} ms: {bound}); torch {job['torch']} on {job['device']}."
    )


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} s"


def _usage(attach: dict[str, Any]) -> str:
    usage = attach.get("usage") or []
    if not usage:
        return "—"
    cpu = max(u["cpu_pct"] for u in usage)
    rss = max(u["rss_mb"] for u in usage)
    return f"{cpu:.1f} % / {rss:.0f} MB"


def _window(w: dict[str, Any] | None) -> str:
    if not w:
        return "—"
    real = f" ({w['false_on_job_idle']} on the job's own idle)" if w["false_on_job_idle"] else ""
    return f"{w['false_gaps']} in {w['window_s']:.0f} s{real}"


def attach_rows(summary: dict[str, Any]) -> list[str]:
    """One row per start of the daemon: how long it took to attach and to stop, the false
    gaps in its first window and over its whole stay, the job's own idle stretches there,
    its CPU and peak resident memory."""
    clean = {c["attach"]: c for c in summary.get("clean", [])}
    out = [
        "| attach | probes | attached in | stopped in | false gaps, first window | "
        "false gaps, whole stay | job's own idle ≥ 5 ms | daemon CPU / RSS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a in summary.get("attaches", []):
        c = clean.get(a["index"], {})
        first, whole = c.get("first"), c.get("whole")
        idle = whole or first
        out.append(
            f"| {a['index']} | {a['probes']} | {_seconds(a['start_s'])} | "
            f"{_seconds(a['stop_s'])} | {_window(first)} | {_window(whole)} | "
            f"{idle['job_idle_5ms'] if idle else '—'} | {_usage(a)} |"
        )
    return out


def scenario_rows(summary: dict[str, Any]) -> list[str]:
    out = [SCENARIO_HEADER]
    for r in summary.get("scenarios", []):
        if "error" in r:
            out.append(f"| {r['scenario']} | not run: {r['error']} | | | | |")
        elif not r["injected"]:
            out.append(f"| {r['scenario']} | no stall injected | | | {r['false_gaps']} | |")
        else:
            out.append(drill_row(r))
    for r in summary.get("scenarios", []):
        if f := r.get("frames"):
            out.append(f"\n{r['scenario']}: the injected function is host work's top frame in "
                       f"{f['named']} of {f['gaps']} gaps (target: >= 90 %)")  # fmt: skip
    return out


def cost_rows(summary: dict[str, Any]) -> list[str]:
    c = summary.get("cost") or {}
    if not c.get("rounds"):
        return ["no complete cost round"]
    rounds = summary.get("rounds", [])
    false = false_gaps(sum(r["on"].get("false_gaps", 0) for r in rounds),
                       sum(r["on"].get("false_on_job_idle", 0) for r in rounds))  # fmt: skip
    low, high = c["cost_pct_range"]
    return [
        "| rounds | step without | step with | cost (median, range) | daemon CPU | daemon RSS "
        "| false gaps in the rounds with it |",
        "|---|---|---|---|---|---|---|",
        f"| {c['rounds']} × {summary.get('round_s', 30):.0f} s | {c['off_ms']:.2f} ms | "
        f"{c['on_ms']:.2f} ms | {c['cost_pct']:+.2f} % ({low:+.2f} to {high:+.2f}) | "
        f"{c['daemon_cpu_pct']:.1f} % of a CPU | {c['daemon_rss_mb']:.0f} MB | {false} |",
    ]


def tables(summary: dict[str, Any]) -> list[str]:
    out = [f"## {summary['mode']}", ""]
    if "job" in summary:
        out += [job_line(summary["job"]), ""]
    out += [*attach_rows(summary), ""]
    if summary["mode"] == "accuracy":
        out += [*scenario_rows(summary), ""]
    else:
        out += [*cost_rows(summary), ""]
    out += [f"- {n}" for n in summary.get("notes", [])]
    return out


def main() -> int:
    for path in map(Path, sys.argv[1:]):
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            print(f"{path}: no summary ({err})")
            continue
        print("\n".join(tables(summary)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
