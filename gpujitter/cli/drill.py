"""`gpujitter drill SCENARIO`: inject one known cause of jitter into a steady feeding loop and
measure how well gpujitter finds and attributes it (daemon/drill/, docs/accuracy.md)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING

from gpujitter.cli.command import Command
from gpujitter.cli.options import duration_arg_ns, path_arg
from gpujitter.cli.output import print_json, table
from gpujitter.daemon.drill.scenarios import SCENARIOS
from gpujitter.daemon.drill.score import TARGETS
from gpujitter.errors import GpujitterError
from gpujitter.files import can_create
from gpujitter.text import printable
from gpujitter.units import format_ns

if TYPE_CHECKING:
    from gpujitter.daemon.drill.runner import DrillResult


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "scenario",
        choices=list(SCENARIOS),
        metavar="SCENARIO",
        help="one of: " + ", ".join(SCENARIOS),
    )
    p.add_argument(
        "-d",
        "--duration",
        metavar="TIME",
        help="how long the loop runs (default 20s; 60s for clean; at most 24h)",
    )
    p.add_argument(
        "--stalls",
        type=int,
        default=8,
        metavar="N",
        help="stalls to inject, spread evenly (default 8)",
    )
    p.add_argument(
        "--stall-ms",
        type=float,
        default=25.0,
        metavar="MS",
        help="length of each stall in ms (default 25)",
    )
    p.add_argument(
        "--backend",
        choices=("auto", "stub", "torch"),
        default="auto",
        help="the feeding loop: the stub libcuda, or PyTorch on a GPU "
        "(default auto: PyTorch when NVML finds a GPU and torch is installed)",
    )
    p.add_argument(
        "--keep-trace",
        type=path_arg,
        metavar="PATH",
        help="also write the drill's event stream as a trace (gpujitter report)",
    )


def progress(text: str) -> None:
    print(f"# {printable(text)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from gpujitter.daemon.drill.runner import MAX_DURATION_S, DrillOptions, run_drill

    if args.stalls < 1:
        raise GpujitterError("--stalls must be at least 1")
    if not 0 < args.stall_ms < math.inf:  # NaN fails this too
        raise GpujitterError(f"--stall-ms {args.stall_ms}: want a length above 0 ms")
    if args.keep_trace is not None:  # said now, not after the drill (its result lost then)
        can_create(args.keep_trace, "--keep-trace")
    duration_s = None if (ns := duration_arg_ns(args)) is None else ns / 1e9
    # 0 was read as "the scenario's default"; 9999h failed once the probes were attached
    if duration_s is not None and not 0 < duration_s <= MAX_DURATION_S:
        raise GpujitterError(
            f"--duration {args.duration}: want a time above 0, at most {MAX_DURATION_S // 3600}h"
        )
    opts = DrillOptions(
        duration_s=duration_s,
        stalls=args.stalls,
        stall_ms=args.stall_ms,
        backend=args.backend,
        keep_trace=args.keep_trace,
    )
    result = run_drill(args.scenario, opts, progress)
    if args.json:
        print_json(result.to_record())
    else:
        print_result(result)
    return 0 if result.score.passed else 1


def print_result(r: DrillResult) -> None:
    s = r.score
    what = f"{s.injected} stalls of {r.stall_ms:g} ms" if s.injected else "no injection"
    print(
        f"drill {r.scenario}: {what} over {r.duration_s:g}s, {r.backend} backend; "
        f"{r.events} events, {r.gaps} gaps"
    )
    for note in r.notes:
        print(f"  {printable(note)}")
    if s.stalls:
        rows = [
            (
                st.index + 1,
                format_ns(st.injected_ns),
                format_ns(st.gap_ns) if st.found else "-",
                st.top_cause or "not found",
                format_ns(st.truth_ns),
                format_ns(st.attributed_ns),
                _pct(st.attributed_ns, st.truth_ns),
            )
            for st in s.stalls
        ]
        print()
        print(
            table(
                [
                    "STALL",
                    "INJECTED",
                    "GAP",
                    "TOP CAUSE",
                    f"TRUTH ({r.truth})",
                    s.cause.upper(),
                    "ERROR",
                ],
                rows,
            )
        )
    for g in s.false_gaps:
        print(
            f"false gap: {format_ns(g.end_ns - g.ts_ns)} at {g.ts_ns} ns, top cause {g.top_cause}"
        )
    print()
    if s.stalls:
        print(
            f"found {s.found}/{s.injected} · top cause {s.cause} {s.top_right}/{s.injected} · "
            f"{s.cause} {format_ns(s.attributed_ns)} of {format_ns(s.truth_ns)} "
            f"({_pct(s.attributed_ns, s.truth_ns)}) · false gaps {len(s.false_gaps)} · "
            f"self-inflicted {s.self_inflicted}"
        )
    else:
        print(f"gaps in {s.window_ns / 1e9:.0f}s of steady feeding: {len(s.false_gaps)} "
              f"(self-inflicted {s.self_inflicted})")  # fmt: skip
    print(
        "targets: "
        + ", ".join(f"{TARGETS[k]}: {'met' if ok else 'MISSED'}" for k, ok in s.targets.items())
    )


def _pct(got: int, truth: int) -> str:
    return f"{100 * (got / truth - 1):+.1f}%" if truth > 0 else "-"


COMMAND = Command(
    name="drill",
    summary="inject known jitter into a feeding loop and score the attributions",
    description="""
        Start a steady synthetic loop that keeps a GPU busy (the stub libcuda here, a
        PyTorch loop on a GPU node), inject one known cause of jitter into its feeding thread
        at known times and lengths so that the GPU goes idle, run the real probes, NVML
        sampler and attribution pipeline beside it, and score what gpujitter says against
        what was injected: stalls found, top cause right, the injected cause's attributed
        time against the truth, false gaps. Needs root; every system change (swap file,
        memory cgroup, sysctl, IRQ affinity, helper processes) is undone on exit, on
        failure and on Ctrl-C. Progress goes to stderr. Exit status 0 when every target
        is met, 1 when one is missed. Scenarios: """
    + "; ".join(f"{s.name}: {s.summary}" for s in SCENARIOS.values())
    + ".",
    examples="""
        # real swap-ins in the feeding thread, the default 8 stalls of 25 ms
        sudo gpujitter drill swap
        # the control: a minute of steady feeding must show no gap
        sudo gpujitter drill clean --json
        # short and few, with the event stream kept for `gpujitter report`
        sudo gpujitter drill contention --duration 8s --stalls 3 --keep-trace c.gjtrace
    """,
    add_arguments=add_arguments,
    run=run,
)
