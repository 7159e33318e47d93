"""CPU settings that delay GPU-feeding threads: the frequency governor and the idle states a
CPU may sleep in (a thread woken on a deeply idle CPU starts late by the exit latency)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.audit.model import AuditContext, Finding, Reading, rule
from gpujitter.probes.host import format_cpulist, read_text
from gpujitter.probes.topology import IdleState


@rule("cpu.governor")
def governor(ctx: AuditContext) -> Iterator[Finding]:
    base = ctx.paths.sys / "devices/system/cpu"
    by_governor: dict[str, list[int]] = defaultdict(list)
    evidence: dict[str, Reading] = {}
    for cpu in ctx.topology.cpus:
        text, ev = ctx.read(base / f"cpu{cpu}/cpufreq/scaling_governor")
        if text is not None:
            by_governor[text.strip()].append(cpu)
            evidence.setdefault(text.strip(), ev)
    if not by_governor:
        _, ev = ctx.read(base / f"cpu{ctx.topology.cpus[0]}/cpufreq/scaling_governor")
        yield Finding(
            "cpu.governor",
            "info",
            "cpufreq",
            "no cpufreq driver: the platform or the hypervisor sets the CPU frequency",
            (ev,),
        )
        return
    slow = {g: cpus for g, cpus in by_governor.items() if g != "performance"}
    if not slow:
        yield Finding(
            "cpu.governor",
            "ok",
            "cpufreq",
            f"performance on CPUs {format_cpulist(by_governor['performance'])}",
            (evidence["performance"],),
        )
        return
    listed = "; ".join(f"{g} on CPUs {format_cpulist(cpus)}" for g, cpus in sorted(slow.items()))
    yield Finding(
        "cpu.governor",
        "warn",
        "cpufreq",
        f"{listed}: CPUs ramp up only after work arrives, so bursts of launches run slow",
        tuple(evidence[g] for g in sorted(slow)),
        remedies.governor_performance(),
    )


@rule("cpu.idle_states")
def idle_states(ctx: AuditContext) -> Iterator[Finding]:
    idle = ctx.topology.idle
    base = ctx.paths.sys / "devices/system/cpu"
    if idle is None:
        return
    if idle.driver is None:
        _, ev = ctx.read(base / "cpuidle/current_driver")
        vm = "hypervisor" in (read_text(ctx.paths.proc / "cpuinfo") or "").split()
        state = next(iter(idle.states.values()), (IdleState(1, "HLT", "", None, None),))[0]
        where = (
            "; in a VM every HLT exits to the hypervisor, so a wake-up costs tens of us"
            if vm
            else ""
        )
        yield Finding(
            "cpu.idle_states",
            "info",
            "cpuidle",
            f"no cpuidle driver: CPUs idle in the default {state.name} state, whose exit "
            f"latency the kernel does not know{where}",
            (ev,),
            remedies.haltpoll() if vm else "",
        )
        return
    bound = ctx.max_exit_latency_us
    deep: dict[str, list[int]] = defaultdict(list)
    shown: dict[str, IdleState] = {}
    deepest: IdleState | None = None
    for cpu, states in sorted(idle.states.items()):
        for st in states:
            if st.disabled:
                continue
            if deepest is None or (st.exit_latency_us or 0) > (deepest.exit_latency_us or 0):
                deepest = st
            if (st.exit_latency_us or 0) > bound:
                deep[st.name].append(cpu)
                shown.setdefault(st.name, st)
    if not deep:
        latency = deepest.exit_latency_us if deepest else 0
        yield Finding(
            "cpu.idle_states",
            "ok",
            "cpuidle",
            f"driver {idle.driver}: deepest enabled state "
            f"{deepest.name if deepest else 'none'} exits in {latency} us (<= {bound} us)",
            (Reading(str(base / "cpuidle/current_driver"), idle.driver),),
        )
        return
    listed = ", ".join(
        f"{name} ({shown[name].exit_latency_us} us) on CPUs {format_cpulist(cpus)}"
        for name, cpus in deep.items()
    )
    evidence = tuple(
        Reading(
            str(base / f"cpu{cpus[0]}/cpuidle/state{shown[name].index}/latency"),
            str(shown[name].exit_latency_us),
        )
        for name, cpus in deep.items()
    )
    yield Finding(
        "cpu.idle_states",
        "warn",
        "cpuidle",
        f"driver {idle.driver}: enabled states that take over {bound} us to leave: {listed}; "
        "a thread woken there starts that much later (disabling them costs power)",
        evidence,
        remedies.limit_idle_latency(bound),
    )
