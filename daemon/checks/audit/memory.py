"""Memory settings that put faults and swap-ins on the GPU-feeding path: swappiness, swap
devices, transparent hugepages (enabled, defrag) and automatic NUMA balancing."""

from __future__ import annotations

from collections.abc import Iterator

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.audit.model import AuditContext, Finding, Reading, rule
from gpujitter.probes.host import decimal, selected_choice
from gpujitter.probes.procfs import Swap, parse_swaps

THP = "kernel/mm/transparent_hugepage"
THP_QUIET = {
    "enabled": ("madvise", "never"),
    "defrag": ("madvise", "defer", "defer+madvise", "never"),
}


def active_swaps(ctx: AuditContext) -> tuple[list[Swap], Reading]:
    """The active swap devices and their evidence (the rows of /proc/swaps)."""
    path = ctx.paths.proc / "swaps"
    text, _ = ctx.read(path)
    lines = [line for line in (text or "").splitlines()[1:] if line.strip()]
    value = "; ".join(" ".join(line.split()) for line in lines) or "no swap device listed"
    return parse_swaps(text or ""), Reading(str(path), value)


@rule("memory.swappiness")
def swappiness(ctx: AuditContext) -> Iterator[Finding]:
    text, ev = ctx.read(ctx.paths.proc / "sys/vm/swappiness")
    subject = "vm.swappiness"
    value = decimal(text or "")
    if value is None:
        yield Finding("memory.swappiness", "info", subject, "not readable", (ev,))
        return
    swaps, swaps_ev = active_swaps(ctx)
    if 1 <= value <= 10:
        yield Finding(
            "memory.swappiness",
            "ok",
            subject,
            f"{value}: page cache is reclaimed well before anonymous memory is swapped",
            (ev,),
        )
    elif value == 0:
        yield Finding(
            "memory.swappiness",
            "warn",
            subject,
            "0 does not fully disable swap on current kernels (anonymous memory is still "
            "swapped under pressure) and brings the OOM killer sooner; 1-10 is the usual advice",
            (ev,),
            remedies.swappiness(10),
        )
    else:
        where = "" if swaps else " (no swap device is active now, so nothing is swapped yet)"
        yield Finding(
            "memory.swappiness",
            "warn" if swaps else "info",
            subject,
            f"{value}: anonymous memory is swapped early{where}; 1-10 is the usual advice",
            (ev, swaps_ev),
            remedies.swappiness(10),
        )


@rule("memory.swap")
def swap_devices(ctx: AuditContext) -> Iterator[Finding]:
    swaps, ev = active_swaps(ctx)
    if not swaps:
        yield Finding("memory.swap", "ok", "swap devices", "no swap device is active", (ev,))
        return
    listed = ", ".join(
        f"{s.path} ({s.kind}, {s.size_kib // 1024} MiB, {s.used_kib // 1024} MiB used)"
        for s in swaps
    )
    yield Finding(
        "memory.swap",
        "warn",
        "swap devices",
        f"{len(swaps)} active: {listed}; a swap-in on the GPU-feeding path costs orders of "
        "magnitude more than RAM (GPU nodes usually run without swap)",
        (ev,),
        remedies.swap_off(),
    )


def _thp(ctx: AuditContext, knob: str) -> Iterator[Finding]:
    name = f"memory.thp_{knob}"
    text, ev = ctx.read(ctx.paths.sys / THP / knob)
    mode = selected_choice(text)
    subject = f"transparent_hugepage/{knob}"
    if mode is None:
        yield Finding(name, "info", subject, "no transparent hugepage support", (ev,))
    elif mode in THP_QUIET[knob]:
        yield Finding(name, "ok", subject, f"{mode}", (ev,))
    else:
        why = {
            "enabled": "every anonymous fault may allocate a huge page and khugepaged "
            "collapses pages behind running threads",
            "defrag": "page faults compact memory synchronously when no huge page is free",
        }[knob]
        yield Finding(
            name,
            "warn",
            subject,
            f"{mode}: {why} (latency-critical nodes: madvise or never)",
            (ev,),
            remedies.thp("madvise", knob),
        )


@rule("memory.thp_enabled")
def thp_enabled(ctx: AuditContext) -> Iterator[Finding]:
    return _thp(ctx, "enabled")


@rule("memory.thp_defrag")
def thp_defrag(ctx: AuditContext) -> Iterator[Finding]:
    return _thp(ctx, "defrag")


@rule("memory.numa_balancing")
def numa_balancing(ctx: AuditContext) -> Iterator[Finding]:
    text, ev = ctx.read(ctx.paths.proc / "sys/kernel/numa_balancing")
    subject = "kernel.numa_balancing"
    if text is None:
        yield Finding("memory.numa_balancing", "ok", subject, "not built into this kernel", (ev,))
    elif text.strip() == "0":
        yield Finding("memory.numa_balancing", "ok", subject, "0 (off)", (ev,))
    elif len(ctx.topology.nodes) == 1:
        yield Finding(
            "memory.numa_balancing",
            "info",
            subject,
            f"{text.strip()} (on), with one NUMA node it has nothing to move",
            (ev,),
            remedies.numa_balancing_off(),
        )
    else:
        yield Finding(
            "memory.numa_balancing",
            "warn",
            subject,
            f"{text.strip()} (on): NUMA hinting faults and page migrations hit GPU-feeding "
            "threads; bind processes to their GPU's node instead",
            (ev,),
            remedies.numa_balancing_off(),
        )
