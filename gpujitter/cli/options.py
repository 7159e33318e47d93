"""Options several subcommands share: which processes to watch, the topology override,
threshold overrides."""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from gpujitter.errors import GpujitterError
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.probes.watch import WatchSpec
from gpujitter.units import parse_duration_ns


def add_watch_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("processes to watch (default: all)")
    g.add_argument("-p", "--pid", type=int, action="append", default=[], help="a process id")
    g.add_argument(
        "-c",
        "--comm",
        action="append",
        default=[],
        metavar="PATTERN",
        help="command-name pattern, shell style ('python*')",
    )
    g.add_argument(
        "--cgroup",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="every process of a cgroup directory",
    )


def watch_from_args(args: argparse.Namespace) -> WatchSpec:
    spec = WatchSpec(pids=set(args.pid), comms=list(args.comm), cgroups=list(args.cgroup))
    for cgroup in spec.cgroups:
        if not (cgroup / "cgroup.procs").is_file():
            raise GpujitterError(f"--cgroup {cgroup}: not a cgroup directory (no cgroup.procs)")
    spec.all = not (spec.pids or spec.comms or spec.cgroups)
    return spec


def add_topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--topology-override",
        type=Path,
        metavar="FILE",
        help="TOML file assigning CPUs to emulated NUMA nodes (see docs/topology.md)",
    )


def topology_from_args(args: argparse.Namespace) -> Topology:
    return load_topology(override=args.topology_override)


def add_threshold_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-t",
        "--threshold",
        action="append",
        default=[],
        metavar="PROBE.KEY=TIME",
        help="override an emission threshold, e.g. sched.offcpu=500us (repeatable)",
    )


def parse_thresholds(items: list[str]) -> dict[str, dict[str, int]]:
    """['sched.offcpu=1ms'] -> {'sched': {'offcpu': 1_000_000}}, checked against the registry."""
    from gpujitter.probes import registry

    out: dict[str, dict[str, int]] = defaultdict(dict)
    for item in items:
        key, sep, value = item.partition("=")
        probe, dot, name = key.partition(".")
        if not sep or not dot:
            raise GpujitterError(
                f"bad threshold {item!r}: want PROBE.KEY=TIME, e.g. sched.offcpu=1ms"
            )
        spec = registry.get(probe)
        if name not in spec.thresholds:
            known = ", ".join(spec.thresholds) or "none"
            raise GpujitterError(f"probe {probe} has no threshold {name!r} (it has: {known})")
        out[probe][name] = parse_duration_ns(value)
    return dict(out)
