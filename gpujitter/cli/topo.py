"""`gpujitter topo`: the whole topology model of this node (or of a recorded tree), as the
probes and the attribution see it, saying when an override file is in force."""

from __future__ import annotations

import argparse
import contextlib
from collections import defaultdict
from collections.abc import Iterator

from gpujitter.cli.command import Command
from gpujitter.cli.options import add_topology_args, path_arg
from gpujitter.cli.output import print_json, table
from gpujitter.errors import GpujitterError
from gpujitter.probes.host import HostPaths, format_cpulist
from gpujitter.probes.topology import Topology, load_topology
from gpujitter.text import printable


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_root_arg(p)
    add_topology_args(p)
    p.add_argument("--no-nvml", action="store_true", help="read GPUs from sysfs only")


def add_root_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--root",
        type=path_arg,
        metavar="DIR",
        help="read a tree recorded from another node (DIR/proc, DIR/sys, DIR/etc) instead of "
        "this host",
    )


@contextlib.contextmanager
def reading_tree(args: argparse.Namespace) -> Iterator[None]:
    """The node's files read as one step: a file missing is judged where it is read, but
    one that cannot be reached (a recorded tree's folder this user may not search, a name
    too long for the system) is one line naming it, not an internal error."""
    try:
        yield
    except OSError as err:
        where = f"--root {args.root}: " if args.root is not None else ""
        what = printable(str(err.filename)) if err.filename else "the node's files"
        raise GpujitterError(f"{where}cannot read {what}: {err.strerror or err}") from None


def paths_from_args(args: argparse.Namespace) -> HostPaths:
    if args.root is None:
        return HostPaths()
    if not (args.root / "proc").is_dir() or not (args.root / "sys").is_dir():
        raise GpujitterError(f"--root {args.root}: not a recorded tree (needs proc/ and sys/)")
    return HostPaths.under(args.root)


def run(args: argparse.Namespace) -> int:
    with reading_tree(args):
        topo = load_topology(
            paths_from_args(args), args.topology_override, nvml=False if args.no_nvml else None
        )
    if args.json:
        print_json(topo.to_record())
    else:
        print(render(topo))
    return 0


def override_banner(topo: Topology) -> str:
    """The line every report that uses an overridden topology prints."""
    if topo.override is None:
        return ""
    return printable(
        f"TOPOLOGY OVERRIDE {topo.override} in force: NUMA nodes are emulated, not this host's"
    )


def render(topo: Topology) -> str:
    out: list[str] = []
    if topo.override:
        out += [override_banner(topo), *map(printable, filter(None, [topo.unknown_gpu_note()])), ""]
    out.append("NUMA nodes")
    out.append(
        table(
            ["NODE", "CPUS", "DISTANCES"],
            [
                (
                    n,
                    format_cpulist(topo.cpus_of(n)),
                    " ".join(map(str, topo.node_distance.get(n, ()))),
                )
                for n in topo.nodes
            ],
        )
    )
    out += ["", _render_idle(topo), ""]
    out.append(f"GPUs (source: {topo.gpu_source or 'unknown'})")
    out.append(
        table(
            ["BUS", "INDEX", "NAME", "NODE", "LOCAL CPUS", "PERSISTENCE"],
            [
                (
                    g.bus_id,
                    _opt(g.index),
                    g.name,
                    _opt(g.numa_node),
                    format_cpulist(g.local_cpus),
                    _opt(g.persistence_mode, {True: "on", False: "off"}),
                )
                for g in topo.gpus
            ],
        )
        if topo.gpus
        else "  none"
    )
    out += ["", "NICs, NVMe and block devices"]
    out.append(
        table(
            ["KIND", "NAME", "BUS", "NODE", "LOCAL CPUS"],
            [
                (d.kind, d.name, d.bus_id or "-", _opt(d.numa_node), format_cpulist(d.local_cpus))
                for d in topo.devices
            ],
        )
        if topo.devices
        else "  none"
    )
    out += ["", "IRQs (counts since boot; NODE is the device's)"]
    out.append(
        table(
            [
                "IRQ",
                "NAME",
                "CHIP",
                "DEVICE",
                "KIND",
                "NODE",
                "AFFINITY",
                "EFFECTIVE",
                "TOTAL",
                "BUSIEST CPUS",
            ],
            [
                (
                    i.irq,
                    i.name or "-",
                    i.chip,
                    i.device or "-",
                    i.device_kind or "-",
                    _opt(i.node),
                    format_cpulist(i.affinity),
                    format_cpulist(i.effective_affinity),
                    i.total,
                    _busiest(i.counts),
                )
                for i in topo.irqs
            ],
        )
    )
    out += ["", "Architecture vectors"]
    out.append(
        table(
            ["NAME", "TOTAL", "BUSIEST CPUS", "WHAT"],
            [(v.name, v.total, _busiest(v.counts), v.desc) for v in topo.vectors],
        )
    )
    return "\n".join(out)


def _render_idle(topo: Topology) -> str:
    idle = topo.idle
    if idle is None:
        return "CPU idle states: not read"
    if idle.driver is None:
        head = (
            f"CPU idle states: no cpuidle driver (governor {idle.governor or 'none'}); CPUs "
            "idle in the kernel's default idle routine, traced by power:cpu_idle as below"
        )
    else:
        head = f"CPU idle states: driver {idle.driver}, governor {idle.governor or 'none'}"
    head = printable(head)  # the driver's and governor's names are what sysfs holds
    groups: dict[tuple, list[int]] = defaultdict(list)
    for cpu, states in sorted(idle.states.items()):
        groups[states].append(cpu)
    rows = [
        (
            format_cpulist(cpus),
            s.index,
            s.name,
            _opt(s.exit_latency_us),
            _opt(s.target_residency_us),
            "disabled" if s.disabled else "enabled",
            s.desc,
        )
        for states, cpus in groups.items()
        for s in states
    ]
    return "\n".join(
        [head, table(["CPUS", "STATE", "NAME", "EXIT US", "RESIDENCY US", "", "DESC"], rows)]
    )


def _opt(value: object, names: dict | None = None) -> str:
    if value is None:
        return "?"
    return str(names.get(value, value)) if names else str(value)


def _busiest(counts: dict[int, int], top: int = 4) -> str:
    ranked = sorted(((n, c) for c, n in counts.items() if n), reverse=True)[:top]
    return " ".join(f"{c}:{n}" for n, c in ranked) or "-"


COMMAND = Command(
    name="topo",
    summary="show the node's topology: NUMA nodes, idle states, GPUs, devices, IRQs",
    description="""
        Print the topology model gpujitter attributes with: CPUs per NUMA node and node
        distances; each CPU's idle states (exit latency, target residency, disabled) or the
        default idle state when there is no cpuidle driver; GPUs with PCI bus id, NUMA node
        and local CPUs (from NVML, or PCI sysfs without it); NICs, NVMe controllers and block
        devices with their node; every IRQ with its handlers, chip, device, device node,
        affinity, effective affinity and counts; the architecture vectors (LOC, RES, CAL,
        TLB...). With --topology-override the emulated nodes are shown and the override is
        named at the top (and in the JSON's "override").
    """,
    examples="""
        # this node
        gpujitter topo
        # as JSON (the same record trace headers carry)
        gpujitter topo --json
        # with CPUs assigned to emulated NUMA nodes
        gpujitter topo --topology-override two-nodes.toml
        # a tree recorded on another node
        gpujitter topo --root tests/fixtures/hosts/two-node-gpu
    """,
    add_arguments=add_arguments,
    run=run,
)
