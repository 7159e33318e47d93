"""`gpujitter audit`: the node tuning checklist for GPU servers, each finding with its
evidence (the value read and the file) and the exact command that fixes it."""

from __future__ import annotations

import argparse
import dataclasses

from gpujitter.cli.command import Command
from gpujitter.cli.options import add_topology_args, count
from gpujitter.cli.output import print_json, table
from gpujitter.cli.topo import add_root_arg, override_banner, paths_from_args, reading_tree
from gpujitter.text import printable

MARK = {"ok": "OK", "info": "INFO", "warn": "WARN", "critical": "CRIT"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-p",
        "--pid",
        type=int,
        action="append",
        default=[],
        help="also audit this process as a GPU process (repeatable)",
    )
    p.add_argument(
        "--rule",
        action="append",
        default=[],
        metavar="NAME",
        help="only these rules or families (memory, cpu, irq, gpu, process, or e.g. "
        "memory.swappiness); repeatable",
    )
    p.add_argument(
        "--max-exit-latency",
        type=count,
        default=10,
        metavar="US",
        help="flag enabled idle states that take longer than US microseconds to leave (default 10)",
    )
    p.add_argument(
        "--fail-on",
        choices=("never", "info", "warn", "critical"),
        default="never",
        help="exit 1 when a finding is at least this severe (default never)",
    )
    p.add_argument("--no-nvml", action="store_true", help="do not ask NVML (GPUs from sysfs)")
    add_root_arg(p)
    add_topology_args(p)


def run(args: argparse.Namespace) -> int:
    from gpujitter.daemon.checks.audit import AuditContext, at_least, run_audit
    from gpujitter.daemon.checks.audit.processes import find_gpu_processes
    from gpujitter.probes.nvml import Nvml, NvmlUnavailable, open_nvml
    from gpujitter.probes.topology import load_topology

    with reading_tree(args):
        paths = paths_from_args(args)
        nvml: Nvml | None = None
        if paths.live and not args.no_nvml:
            try:
                nvml = open_nvml()
            except (NvmlUnavailable, ImportError):
                nvml = None
        try:
            topo = load_topology(
                paths, args.topology_override, nvml=nvml or (False if args.no_nvml else None)
            )
            processes = find_gpu_processes(paths, topo, args.pid, nvml)
        finally:
            if nvml is not None:
                nvml.close()
        ctx = AuditContext(
            paths=paths,
            topology=topo,
            processes=processes,
            max_exit_latency_us=args.max_exit_latency,
        )
        findings = run_audit(ctx, args.rule)
    failed = args.fail_on != "never" and bool(at_least(findings, args.fail_on))
    if args.json:
        print_json(
            {
                "topology_override": topo.override,
                "root": str(args.root) if args.root else None,
                "gpu_source": topo.gpu_source,
                "processes": [dataclasses.asdict(p) for p in processes],
                "findings": [dataclasses.asdict(f) for f in findings],
            }
        )
        return 1 if failed else 0
    if topo.override:
        print(override_banner(topo) + "\n")
    if args.root:
        print(f"recorded tree {printable(str(args.root))}\n")
    print(
        table(
            ["#", "SEVERITY", "RULE", "SUBJECT", "FINDING"],
            [
                (n, MARK[f.severity], f.rule, f.subject, f.message)
                for n, f in enumerate(findings, 1)
            ],
        )
    )
    details = [(n, f) for n, f in enumerate(findings, 1) if f.severity != "ok"]
    if details:
        print("\nevidence and fixes:")
    # Subjects and evidence hold process names, command lines and file contents: inert.
    for n, f in details:
        print(f"[{n}] {f.rule} {printable(f.subject)}")
        for ev in f.evidence:
            print(f"      {printable(ev.file)}: {printable(ev.value)}")
        if f.fix:
            print(f"      fix: {printable(f.fix)}")
    counts = {s: sum(f.severity == s for f in findings) for s in MARK}
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return 1 if failed else 0


COMMAND = Command(
    name="audit",
    summary="audit the node's tuning for GPU work: findings, evidence and fixes",
    description="""
        Check the settings that make GPU-feeding threads stall: swappiness and swap devices,
        transparent hugepages (enabled, defrag), automatic NUMA balancing, the CPU frequency
        governor, enabled idle states and their exit latencies, irqbalance, the affinity of
        GPU, NIC, NVMe and disk IRQs against their device's NUMA node, GPU persistence mode,
        and for every GPU process (NVML's compute processes, else processes with libcuda
        mapped, plus --pid): CPU affinity and memory placement against its GPU's node, the
        memlock limit and the allocator in use. Each finding has a severity (ok, info,
        warn, critical), the evidence it rests on (value and file) and the exact fix.
    """,
    examples="""
        # the checklist for this node
        gpujitter audit
        # as JSON, failing a provisioning step on any warning
        gpujitter audit --json --fail-on warn
        # include a training process NVML cannot see (e.g. another PID namespace)
        gpujitter audit --pid 4121
        # only the memory and IRQ rules
        gpujitter audit --rule memory --rule irq
        # a tree recorded on another node
        gpujitter audit --root tests/fixtures/hosts/two-node-gpu
    """,
    add_arguments=add_arguments,
    run=run,
)
