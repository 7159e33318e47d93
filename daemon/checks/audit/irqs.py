"""Where interrupts land: irqbalance (which moves them by itself) and the affinity of every
GPU, NIC, NVMe and disk IRQ against the NUMA node of its device."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.audit.model import AuditContext, Finding, Reading, rule
from gpujitter.probes.host import (
    format_cpulist,
    parse_cpulist,
    proc_pids,
    read_foreign,
    read_name,
    read_text,
)
from gpujitter.probes.topology import IrqInfo

AUDITED_KINDS = ("gpu", "nic", "nvme", "block")
BANNED_KEYS = ("IRQBALANCE_BANNED_CPULIST", "IRQBALANCE_BANNED_CPUS")
# NVMe I/O queue vectors are kernel-managed: spread one per CPU group over every node, not
# movable (writes to smp_affinity_list fail), and only fire for I/O submitted on their CPUs.
MANAGED_IRQ = re.compile(r"^nvme\d+q[1-9]\d*$")


def pids_named(ctx: AuditContext, comm: str) -> list[int]:
    return [
        pid
        for pid in proc_pids(ctx.paths)
        if (read_name(ctx.paths.proc / str(pid) / "comm") or "") == comm
    ]


def _banned_cpus(ctx: AuditContext, pid: int) -> tuple[list[int], Reading] | None:
    """irqbalance's banned CPUs from its environment or its config file, with evidence."""
    environ = ctx.paths.proc / str(pid) / "environ"
    sources: list[tuple[Path, list[str]]] = [
        (environ, (read_foreign(environ) or "").split("\0")),
        *(
            (f, (read_text(f) or "").splitlines())
            for f in (ctx.paths.etc / "default/irqbalance", ctx.paths.etc / "sysconfig/irqbalance")
        ),
    ]
    for path, lines in sources:
        for line in lines:
            key, sep, value = line.strip().partition("=")
            value = value.strip().strip("\"'")
            if not sep or key not in BANNED_KEYS or not value:
                continue
            try:
                cpus = parse_cpulist(value) if key.endswith("CPULIST") else _mask(value)
            except ValueError:
                continue
            return cpus, Reading(str(path), f"{key}={value}")
    return None


def _mask(text: str) -> list[int]:
    value = int(text.replace(",", ""), 16)
    return [bit for bit in range(value.bit_length()) if value >> bit & 1]


@rule("irq.irqbalance")
def irqbalance(ctx: AuditContext) -> Iterator[Finding]:
    pids = pids_named(ctx, "irqbalance")
    if not pids:
        yield Finding(
            "irq.irqbalance",
            "ok",
            "irqbalance",
            "not running: IRQ affinity stays where it is set",
            (Reading(str(ctx.paths.proc / "*/comm"), "no process named irqbalance"),),
        )
        return
    running = Reading(str(ctx.paths.proc / str(pids[0]) / "comm"), "irqbalance")
    banned = _banned_cpus(ctx, pids[0])
    if banned is not None:
        cpus, ev = banned
        yield Finding(
            "irq.irqbalance",
            "ok",
            "irqbalance",
            f"running (pid {pids[0]}), keeps IRQs off CPUs {format_cpulist(cpus)}",
            (running, ev),
        )
        return
    yield Finding(
        "irq.irqbalance",
        "warn",
        "irqbalance",
        f"running (pid {pids[0]}) with no banned CPUs: it moves IRQs, GPU and NIC ones "
        "included, onto GPU-feeding CPUs and undoes affinity set by hand",
        (running,),
        remedies.irqbalance_off(),
    )


def _device_names(ctx: AuditContext) -> dict[str, str]:
    """PCI address -> the name an operator knows it by (ens1f0, nvme0; a GPU by its address)."""
    rank = {"block": 0, "nic": 1, "nvme": 2}
    names = {
        d.bus_id: d.name
        for d in sorted(ctx.topology.devices, key=lambda d: rank[d.kind])
        if d.bus_id
    }
    names.update({g.bus_id: g.bus_id for g in ctx.topology.gpus})
    return names


def _node_evidence(ctx: AuditContext, irq: IrqInfo) -> Reading:
    if ctx.topology.override and irq.irq in ctx.topology.irq_node:
        return Reading(ctx.topology.override, f"[irqs] {irq.irq} = {irq.node}")
    return ctx.read(ctx.paths.sys / "bus/pci/devices" / str(irq.device) / "numa_node")[1]


def _effective(ctx: AuditContext, irq: IrqInfo) -> Reading:
    return ctx.read(ctx.paths.proc / "irq" / str(irq.irq) / "effective_affinity_list")[1]


@rule("irq.affinity")
def irq_affinity(ctx: AuditContext) -> Iterator[Finding]:
    """Per device: a warning for each IRQ handled off its device's node, else one ok line;
    kernel-managed queue vectors (spread over all nodes by design) are counted, not flagged."""
    topo = ctx.topology
    names = _device_names(ctx)
    by_device: dict[str, list[IrqInfo]] = defaultdict(list)
    for irq in topo.irqs:
        if irq.device and irq.device_kind in AUDITED_KINDS:
            by_device[irq.device].append(irq)
    single = topo.nodes[0] if len(topo.nodes) == 1 else None
    for bus, irqs in sorted(by_device.items()):
        label = f"{irqs[0].device_kind} {names.get(bus, bus)}"
        local: list[IrqInfo] = []
        managed: list[IrqInfo] = []
        unknown: list[IrqInfo] = []
        remote_found = False
        for irq in irqs:
            node = irq.node if irq.node is not None else single
            if node is None:
                unknown.append(irq)
                continue
            cpus = irq.effective_affinity or irq.affinity
            remote = sorted(set(cpus) - set(topo.cpus_of(node)))
            if not remote:
                local.append(irq)
            elif MANAGED_IRQ.match(irq.name):
                managed.append(irq)
            else:
                remote_found = True
                nodes = ", ".join(str(n) for n in sorted({topo.node_of(c) for c in remote}))
                yield Finding(
                    "irq.affinity",
                    "warn",
                    f"IRQ {irq.irq} {irq.name}",
                    f"{label}: handled on CPUs {format_cpulist(cpus)} (node {nodes}), remote "
                    f"from its device on node {node}",
                    (_effective(ctx, irq), _node_evidence(ctx, irq)),
                    remedies.irq_affinity(irq.irq, topo.cpus_of(node)),
                )
        if unknown:
            yield Finding(
                "irq.affinity",
                "info",
                label,
                f"NUMA node of the device unknown (numa_node -1): {len(unknown)} IRQ(s) not "
                "checked",
                (ctx.read(ctx.paths.sys / "bus/pci/devices" / bus / "numa_node")[1],),
            )
        if not remote_found and (local or managed):
            node = single if single is not None else (local + managed)[0].node
            why = " (one NUMA node: every CPU is local)" if single is not None else ""
            spread = (
                f"; {len(managed)} kernel-managed queue vector(s) "
                f"({', '.join(i.name for i in managed[:4])}) sit on other nodes' CPUs by "
                "design and fire only for I/O submitted there"
                if managed
                else ""
            )
            yield Finding(
                "irq.affinity",
                "ok",
                label,
                f"{len(local)} of {len(irqs)} IRQ(s) handled on node {node}'s CPUs{why}{spread}",
                tuple(_effective(ctx, i) for i in (local + managed)[:4]),
            )
