"""`gpujitter doctor`: one line per check of what profiling needs, with the exact fix for
anything not passing; exit 0 when profiling can run, 1 when it cannot."""

from __future__ import annotations

import argparse
import dataclasses

from gpujitter.cli.command import Command
from gpujitter.cli.options import add_socket_arg, add_topology_args, socket_from_args
from gpujitter.cli.output import print_json
from gpujitter.text import printable

MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "info": "INFO"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--load",
        action="store_true",
        help="also load the core BPF module and every probe for a moment (needs root), and "
        "ask a daemon running on this node for its own account",
    )
    add_socket_arg(p, "asked with --load")
    add_topology_args(p)


def run(args: argparse.Namespace) -> int:
    from gpujitter.daemon.checks.doctor import DoctorEnv, can_profile, run_checks

    env = DoctorEnv(
        override=args.topology_override,
        load=args.load,
        socket=socket_from_args(args) if args.load else None,
    )
    results = run_checks(env)
    ok = can_profile(results)
    if args.json:
        print_json(
            {
                "ok": ok,
                "topology_override": str(args.topology_override)
                if args.topology_override
                else None,
                "checks": [dataclasses.asdict(r) for r in results],
            }
        )
        return 0 if ok else 1
    width = max(len(r.check) for r in results)
    for r in results:
        # A detail can quote what the node holds (paths, process names, kernel messages).
        print(f"{MARK[r.status]}  {r.check.ljust(width)}  {printable(r.detail)}")
        if r.fix and r.status in ("warn", "fail"):
            print(f"{'':6}{'':{width}}  fix: {printable(r.fix)}")
    counts = {s: sum(r.status == s for r in results) for s in MARK}
    verdict = "profiling can run" if ok else "profiling cannot run"
    print(f"\n{verdict}: {counts['pass']} pass, {counts['warn']} warn, {counts['fail']} fail")
    return 0 if ok else 1


COMMAND = Command(
    name="doctor",
    summary="check that this node can run gpujitter, and how to fix what is missing",
    description="""
        Check everything profiling needs, one line each: kernel version, BTF, tracefs, bcc,
        kernel headers, privileges, perf_event_paranoid, kernel lockdown, the hooks of every
        registered probe (tracepoints, perf events, uprobes), RLIMIT_MEMLOCK, NVML and the
        GPUs, the clock source and the topology. kprobes and fentry are reported for the
        record: gpujitter does not use them. Anything that does not pass comes with the exact
        command that fixes it.

        --load really loads the core module and every probe for a moment: each probe's BPF
        cost, what the start took (wall, CPU, peak memory) and the daemon's own scheduling
        read back. Where a daemon runs (its stream socket answers), --load adds its own
        account from its status record: its CPU, resident memory, events a second, events
        lost, gaps attributed and how many its own threads caused, and each probe's BPF
        cost, events and losses ("daemon PROBE" lines).

        Exit status: 0 when profiling can run (warnings only narrow it), 1 when it cannot.
    """,
    examples="""
        # is this node ready?
        gpujitter doctor
        # the same as JSON, for a provisioning script
        gpujitter doctor --json
        # really load the core module and every probe for half a second; and what the
        # running daemon says it costs
        gpujitter doctor --load
        # check with emulated NUMA nodes (the override is reported)
        gpujitter doctor --topology-override two-nodes.toml
    """,
    add_arguments=add_arguments,
    run=run,
)
