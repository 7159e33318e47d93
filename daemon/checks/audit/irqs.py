"""Where interrupts land: irqbalance (which moves them by itself) and the affinity of every
GPU, NIC, NVMe and disk IRQ against the NUMA node of its device."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.audit.model import (
    AuditContext,
    Finding,
    Reading,
    not_readable,
    read_process_file,
    rule,
)
from gpujitter.probes.host import (
    MAX_CPU,
    format_cpulist,
    parse_cpulist,
    proc_pids,
    read_name,
    read_text,
    status_fields,
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


def owner_uid(ctx: AuditContext, pid: int) -> str:
    """The real uid of process `pid` from its status ("" when status cannot be read)."""
    return (status_fields(ctx.paths, pid).get("Uid", "").split() or [""])[0]


def _banned_cpus(
    ctx: AuditContext, pids: list[int]
) -> tuple[tuple[list[int], Reading] | None, list[Reading]]:
    """irqbalance's banned CPUs from its environment or its config file, with evidence; and
    the environments that could not be read (banned CPUs may hide there)."""
    sources: list[tuple[Path, list[str]]] = []
    unread: list[Reading] = []
    for pid in pids:
        environ = ctx.paths.proc / str(pid) / "environ"
        try:
            sources.append((environ, read_process_file(environ).split("\0")))
        except FileNotFoundError:
            continue  # exited, or a recorded tree without it: the config files still tell
        except OSError as err:
            unread.append(not_readable(environ, err))
    for f in (ctx.paths.etc / "default/irqbalance", ctx.paths.etc / "sysconfig/irqbalance"):
        sources.append((f, (read_text(f) or "").splitlines()))
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
            return (cpus, Reading(str(path), f"{key}={value}")), unread
    return None, unread


def _mask(text: str) -> list[int]:
    """The CPUs of a hex mask ("ff,00000000"), digit by digit: shifting one big number once
    per bit took time growing with the square of its length (a 1 MB mask: minutes)."""
    digits = text.replace(",", "")
    if len(digits) > MAX_CPU // 4:  # past any kernel's CPUs
        raise ValueError(f"CPU mask of {len(digits)} hex digits")
    nibbles = [int(d, 16) for d in reversed(digits)]  # ValueError for what is no hex digit
    return [4 * i + bit for i, n in enumerate(nibbles) for bit in range(4) if n >> bit & 1]


@rule("irq.irqbalance")
def irqbalance(ctx: AuditContext) -> Iterator[Finding]:
    name = "irq.irqbalance"
    named = pids_named(ctx, "irqbalance")
    # Any user may name a process irqbalance (prctl, or a copy of any binary so named); only
    # root can move IRQs, so only root's is the daemon.
    owners = {pid: owner_uid(ctx, pid) for pid in named}
    pids = [pid for pid in named if owners[pid] == "0"]
    unknown = [pid for pid in named if owners[pid] == ""]
    if not pids and unknown:
        status = ctx.paths.proc / str(unknown[0]) / "status"
        yield Finding(
            name,
            "info",
            "irqbalance",
            f"not checked: a process named irqbalance (pid {unknown[0]}) runs, whose owner "
            "is not known (its status not readable)",
            (ctx.read(status)[1],),
        )
        return
    if not pids:
        others = [
            Reading(str(ctx.paths.proc / str(pid) / "status"), f"Uid: {owners[pid]} (not root)")
            for pid in named
        ]
        yield Finding(
            name,
            "ok",
            "irqbalance",
            "not running: IRQ affinity stays where it is set",
            (Reading(str(ctx.paths.proc / "*/comm"), "no root process named irqbalance"), *others),
        )
        return
    running = f"running (pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids))})"
    evidence = (
        Reading(str(ctx.paths.proc / str(pids[0]) / "comm"), "irqbalance"),
        Reading(str(ctx.paths.proc / str(pids[0]) / "status"), "Uid: 0"),
    )
    banned, unread = _banned_cpus(ctx, pids)
    if banned is not None:
        cpus, ev = banned
        yield Finding(
            name,
            "ok",
            "irqbalance",
            f"{running}, keeps IRQs off CPUs {format_cpulist(cpus)}",
            (*evidence, ev),
        )
        return
    if unread:
        yield Finding(
            name,
            "info",
            "irqbalance",
            f"{running}; its banned CPUs not known: its environ not readable",
            (*evidence, *unread),
        )
        return
    yield Finding(
        name,
        "warn",
        "irqbalance",
        f"{running} with no banned CPUs: it moves IRQs, GPU and NIC ones included, onto "
        "GPU-feeding CPUs and undoes affinity set by hand",
        evidence,
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
    """The affinity the rule judged, from the file it came from: smp_affinity_list where the
    kernel has no effective_affinity_list (built without GENERIC_IRQ_EFFECTIVE_AFF_MASK)."""
    name = "effective_affinity_list" if irq.effective_affinity else "smp_affinity_list"
    return ctx.read(ctx.paths.proc / "irq" / str(irq.irq) / name)[1]


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
    # The topology's CPUs are the online ones (sys/devices/system/cpu/online); an affinity
    # may still name offline CPUs (smp_affinity_list keeps them), whose node is not known.
    online = set(topo.cpu_node)
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
            named = irq.effective_affinity or irq.affinity
            cpus = sorted(set(named) & online)
            if named and not cpus:
                yield _offline(ctx, irq, label, named, node)
                continue
            remote = sorted(set(cpus) - set(topo.cpus_of(node)))
            if not remote:
                local.append(irq)
            elif MANAGED_IRQ.match(irq.name):
                managed.append(irq)
            else:
                remote_found = True
                nodes = ", ".join(str(n) for n in sorted({topo.cpu_node[c] for c in remote}))
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


def _offline(
    ctx: AuditContext, irq: IrqInfo, label: str, named: tuple[int, ...], node: int
) -> Finding:
    """An IRQ whose affinity names only offline CPUs: a kernel-managed vector is shut down
    until one comes back, any other is handled where the kernel chose, which is not known."""
    several = len(ctx.topology.nodes) > 1 and not MANAGED_IRQ.match(irq.name)
    return Finding(
        "irq.affinity",
        "info",
        f"IRQ {irq.irq} {irq.name}",
        f"{label}: its affinity names only offline CPUs {format_cpulist(list(named))}: "
        "where it is handled is not known",
        (_effective(ctx, irq), ctx.read(ctx.paths.sys / "devices/system/cpu/online")[1]),
        remedies.irq_affinity(irq.irq, ctx.topology.cpus_of(node)) if several else "",
    )
