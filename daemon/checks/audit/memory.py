"""Memory settings that put faults and swap-ins on the GPU-feeding path: swappiness, swap
devices, transparent hugepages (enabled, defrag), automatic NUMA balancing, and memory taken
back behind the job's back (a VM's free page reporting, DAMON paging out)."""

from __future__ import annotations

from collections.abc import Iterator

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.audit.model import AuditContext, Finding, Reading, rule
from gpujitter.probes.host import decimal, selected_choice
from gpujitter.probes.procfs import Swap, parse_swaps

THP = "kernel/mm/transparent_hugepage"
BALLOON = "bus/virtio/drivers/virtio_balloon"
# VIRTIO_BALLOON_F_REPORTING: the guest reports the pages it frees and the host reclaims them
# (a device's `features` is one 0/1 character per feature bit, bit 0 first).
F_REPORTING = 5
DAMON = "kernel/mm/damon/admin/kdamonds"
DAMON_RECLAIM = "module/damon_reclaim/parameters/enabled"
# The rules that tell of memory taken back behind a job: page faults slow at random, which
# the faults probe reads as host work (the drills say so beside their fault scenarios).
SLOW_FAULT_RULES = ("memory.page_reporting", "memory.damon")
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


@rule("memory.page_reporting")
def page_reporting(ctx: AuditContext) -> Iterator[Finding]:
    name, subject = "memory.page_reporting", "virtio-balloon free page reporting"
    devices = sorted((ctx.paths.sys / BALLOON).glob("virtio*/features"))
    if not devices:
        none = Reading(str(ctx.paths.sys / BALLOON), "absent")
        yield Finding(name, "ok", subject, "no virtio balloon device", (none,))
        return
    readings, reporting = [], []
    for path in devices:
        text, ev = ctx.read(path)
        readings.append(ev)
        bits = (text or "").strip()
        if len(bits) > F_REPORTING and bits[F_REPORTING] == "1":
            reporting.append(path.parent.name)
    if not reporting:
        yield Finding(name, "ok", subject, "not negotiated by the balloon", tuple(readings))
        return
    yield Finding(
        name,
        "warn",
        subject,
        f"on ({', '.join(reporting)}): the host takes back the memory this VM frees, and a "
        "first touch of such a page waits while the host backs it again (150-650 us a "
        "fault on such a VM, against ~2 us); faults that slow come at random, and the "
        "faults probe cannot time them: they read as host work",
        tuple(readings),
        remedies.keep_free_page_reporting_off(),
    )


@rule("memory.damon")
def damon(ctx: AuditContext) -> Iterator[Finding]:
    """A running kdamond with a `pageout` scheme: on physical memory (paddr) it reclaims
    any process's cold pages; on virtual address spaces (vaddr) only its target processes'."""
    name, subject = "memory.damon", "DAMON"
    readings: list[Reading] = []
    # kdamonds paging out: any process's memory, their target processes' only
    machine: list[str] = []
    targeted: list[str] = []
    for state in sorted((ctx.paths.sys / DAMON).glob("*/state")):
        text, ev = ctx.read(state)
        readings.append(ev)
        if (text or "").strip() != "on":
            continue
        for context in sorted(state.parent.glob("contexts/*")):
            ops, ops_ev = ctx.read(context / "operations")
            actions = []
            for action in sorted(context.glob("schemes/*/action")):
                act, act_ev = ctx.read(action)
                readings.append(act_ev)
                actions.append((act or "").strip())
            if "pageout" in actions:
                readings.append(ops_ev)
                (machine if (ops or "").strip() == "paddr" else targeted).append(state.parent.name)
    reclaim, reclaim_ev = ctx.read(ctx.paths.sys / DAMON_RECLAIM)
    if reclaim is not None:
        readings.append(reclaim_ev)
    reclaiming = reclaim is not None and reclaim.strip() == "Y"  # DAMON_RECLAIM: paddr
    evidence = tuple(readings) or (Reading(str(ctx.paths.sys / DAMON), "absent"),)
    if not machine and not reclaiming:
        if targeted:
            some = ", ".join(f"kdamond {k}" for k in dict.fromkeys(targeted))
            yield Finding(name, "info", subject, f"pages out the cold memory of its target "
                          f"processes only ({some}): check that no GPU job is among them",
                          evidence)  # fmt: skip
        else:
            what = "no kdamond pages memory out" if readings else "not running"
            yield Finding(name, "ok", subject, what, evidence)
        return
    kdamonds = list(dict.fromkeys(machine))
    who = [f"kdamond {k}" for k in kdamonds] + ["DAMON_RECLAIM"] * reclaiming
    fixes = [remedies.damon_off(k) for k in kdamonds] + [remedies.damon_reclaim_off()] * reclaiming
    yield Finding(
        name,
        "warn",
        subject,
        f"pages out any memory it finds cold ({', '.join(who)}): a job's buffers idle "
        "between uses are reclaimed, and fault back in on the feeding path",
        evidence,
        " && ".join(fixes),
    )
