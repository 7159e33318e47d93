"""Options several subcommands share: which processes to watch, the topology override,
threshold overrides, the daemon's socket; checked as the daemon's settings of the same
meaning are."""

from __future__ import annotations

import argparse
from pathlib import Path

from gpujitter.daemon.service.config import (
    check_cgroup,
    load_config,
    parse_value,
    thresholds_by_probe,
)
from gpujitter.errors import GpujitterError
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.probes.watch import WatchSpec
from gpujitter.units import parse_duration_ns

# An output file given as "-": standard output. Compared as given: ./- names a file "-".
STDOUT = "-"


def duration_arg_ns(args: argparse.Namespace) -> int | None:
    """--duration in ns (a bare number in seconds); None when it was not given. An empty
    value is refused as any bad one, not taken as "not given" (run until stopped)."""
    return None if args.duration is None else parse_duration_ns(args.duration, "s")


def path_arg(text: str) -> Path:
    """A path option's value: an empty one (an unset variable in a script) is refused, not
    taken for this directory as Path("") is."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path was given")
    return Path(text)


def count(text: str) -> int:
    """An option's whole number, 0 or more (things to show, microseconds)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"want a whole number, 0 or more, not {text!r}")
    return n


def add_traces_arg(p: argparse.ArgumentParser) -> None:
    """The recordings an offline command reads (args.traces)."""
    p.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE",
        help="recordings: trace files, directories of them (a rotated recording), events "
        "files (gaps --save-events), attribution logs or run --json's output; files or glob "
        "patterns",
    )


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
        type=path_arg,
        metavar="DIR",
        help="every process of a cgroup directory and of the cgroups below it",
    )
    g.add_argument(
        "--pod",
        action="append",
        default=[],
        metavar="[NAMESPACE/]NAME",
        help="every process of a Kubernetes pod (named by its runtime's files on this node)",
    )
    g.add_argument(
        "--slurm-job",
        action="append",
        default=[],
        metavar="ID",
        help="every process of a Slurm job on this node",
    )


def watch_from_args(args: argparse.Namespace) -> WatchSpec:
    pids = parse_value("watch.pids", args.pid, "flag --pid") if args.pid else ()
    comms = parse_value("watch.comms", args.comm, "flag --comm") if args.comm else ()
    pods = parse_value("watch.pods", args.pod, "flag --pod") if args.pod else ()
    jobs = (
        parse_value("watch.slurm_jobs", args.slurm_job, "flag --slurm-job")
        if args.slurm_job
        else ()
    )
    spec = WatchSpec(
        pids=set(pids),
        comms=list(comms),
        cgroups=list(args.cgroup),
        pods=list(pods),
        slurm_jobs=list(jobs),
    )
    for cgroup in spec.cgroups:
        try:
            check_cgroup(cgroup)
        except ValueError as err:
            raise GpujitterError(f"flag --cgroup: {err}") from None
    spec.all = not spec.selects_any()
    return spec


def add_topology_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--topology-override",
        type=path_arg,
        metavar="FILE",
        help="TOML file assigning CPUs to emulated NUMA nodes (see docs/topology.md)",
    )


def topology_from_args(args: argparse.Namespace) -> Topology:
    """The node's topology; a command's --no-nvml keeps NVML out of it too (GPUs from sysfs)."""
    nvml = False if getattr(args, "no_nvml", False) else None
    return load_topology(override=args.topology_override, nvml=nvml)


def add_socket_arg(p: argparse.ArgumentParser, why: str) -> None:
    """--socket: the running daemon's stream socket, which the command reads `why`."""
    p.add_argument(
        "--socket",
        type=path_arg,
        metavar="PATH",
        help=f"the daemon's stream socket, {why} (default: socket.path of the daemon's "
        "configuration, /run/gpujitter/gpujitter.sock)",
    )


def socket_from_args(args: argparse.Namespace) -> Path:
    """--socket, else where the daemon's configuration puts its socket."""
    if args.socket is not None:
        return Path(args.socket)
    return Path(load_config()["socket.path"])


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
    """['sched.offcpu=1ms'] -> {'sched': {'offcpu': 1_000_000}}, checked as the daemon's
    probes.thresholds are."""
    if not items:
        return {}
    return thresholds_by_probe(parse_value("probes.thresholds", items, "flag --threshold"))
