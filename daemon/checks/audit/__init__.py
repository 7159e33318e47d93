"""`gpujitter audit`: the node tuning checklist for GPU servers. Rules live one family per
module (RULE_MODULES) and register themselves; each returns findings with severity, evidence
and the fix from daemon/analysis/remedies.py, so the audit and the attribution's remedies agree."""

from __future__ import annotations

from collections.abc import Iterable

# The rule families (RULE_MODULES gives the order their findings print in); each module
# registers its rules into RULES as it is imported.
from gpujitter.daemon.checks.audit import cpu, gpus, irqs, memory, processes
from gpujitter.daemon.checks.audit.memory import SLOW_FAULT_RULES
from gpujitter.daemon.checks.audit.model import (
    RULES,
    SEVERITIES,
    AuditContext,
    Finding,
    GpuProcess,
    Reading,
    Severity,
)
from gpujitter.errors import GpujitterError
from gpujitter.probes.host import HostPaths
from gpujitter.probes.topology import Topology

RULE_MODULES = (memory, cpu, irqs, gpus, processes)

# Files the rules read besides the topology's, as record_tree patterns; {pid} is each GPU
# process (and irqbalance, nvidia-persistenced).
TREE = (
    "proc/swaps",
    "proc/cpuinfo",
    "proc/sys/vm/swappiness",
    "proc/sys/kernel/numa_balancing",
    "sys/kernel/mm/transparent_hugepage/{enabled,defrag}",
    "sys/bus/virtio/drivers/virtio_balloon/virtio*/features",
    "sys/kernel/mm/damon/admin/kdamonds/*/state",
    "sys/kernel/mm/damon/admin/kdamonds/*/contexts/*/{operations,schemes/*/action}",
    "sys/module/damon_reclaim/parameters/enabled",
    "sys/devices/system/cpu/cpu*/cpufreq/scaling_governor",
    "etc/default/irqbalance",
    "etc/sysconfig/irqbalance",
)
PROCESS_TREE = ("proc/{pid}/{comm,status,limits,maps,numa_maps,environ}",)

__all__ = [
    "RULES",
    "SEVERITIES",
    "AuditContext",
    "Finding",
    "GpuProcess",
    "Reading",
    "Severity",
    "run_audit",
    "slow_fault_notes",
]


def run_audit(ctx: AuditContext, only: Iterable[str] = ()) -> list[Finding]:
    """Every rule's findings, in rule order; `only` limits to rules or families by prefix.
    A name in `only` that is no rule or family is refused (it would audit nothing, silently)."""
    wanted = tuple(only)
    unknown = [w for w in wanted if not any(n == w or n.startswith(w + ".") for n in RULES)]
    if unknown:
        families = sorted({name.split(".")[0] for name in RULES})
        raise GpujitterError(
            f"no audit rule {', '.join(map(repr, unknown))}: rules are FAMILY.NAME "
            f"(families: {', '.join(families)}; `gpujitter audit --json` lists every rule)"
        )
    findings: list[Finding] = []
    for name, fn in sorted(RULES.items(), key=_family_order):
        if wanted and not any(name == w or name.startswith(w + ".") for w in wanted):
            continue
        findings.extend(fn(ctx))
    return findings


def at_least(findings: list[Finding], severity: Severity) -> list[Finding]:
    floor = SEVERITIES.index(severity)
    return [f for f in findings if SEVERITIES.index(f.severity) >= floor]


def _family_order(item: tuple[str, object]) -> int:
    module = getattr(item[1], "__module__", "")
    return next((n for n, m in enumerate(RULE_MODULES) if m.__name__ == module), len(RULE_MODULES))


def slow_fault_notes(paths: HostPaths, topology: Topology) -> list[str]:
    """One line per warning of the rules that tell of memory taken back behind a job (the
    host reclaiming a VM's free pages, DAMON paging cold memory out): page faults slow at
    random, more than the faults probe can time, which it reads as host work. Said by the
    daemon at start and by the fault drills, so that such host work is not taken for the
    job's code."""
    ctx = AuditContext(paths=paths, topology=topology)
    return [f"{f.rule}: {f.message}" for f in run_audit(ctx, SLOW_FAULT_RULES)
            if f.severity == "warn"]  # fmt: skip
