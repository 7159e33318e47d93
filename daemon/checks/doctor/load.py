"""`doctor --load`: the core BPF module and every probe really loaded for a moment, each
probe's measured cost, and the daemon's own scheduling applied and read back."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.doctor.model import DoctorEnv, Result, Status, check
from gpujitter.daemon.service.own_scheduling import OwnScheduling, thread_policies
from gpujitter.errors import GpujitterError
from gpujitter.probes.events import ProbeStatus
from gpujitter.probes.topology import load_topology


def cost_text(st: ProbeStatus) -> str:
    """A probe's measured BPF cost in one phrase (an idle node's: its own background)."""
    if st.bpf_ns_per_s < 0:
        return "BPF cost not measured (statistics refused, or no BPF programs)"
    per_run = st.bpf_ns_per_s / st.bpf_runs_per_s if st.bpf_runs_per_s > 0 else 0
    return (
        f"BPF {st.bpf_runs_per_s} runs/s, {per_run:.0f} ns/run, "
        f"{st.bpf_ns_per_s / 1e7:.3f}% of a CPU ({st.cost_from}), "
        f"{st.events} events, {st.lost_kernel + st.lost_user} lost"
    )


@check
def check_load(env: DoctorEnv) -> Iterator[Result]:
    """--load: the core module and every registered probe, really loaded for a moment."""
    if not env.load:
        return
    from gpujitter.probes.runner import ProbeSet
    from gpujitter.probes.watch import WatchSpec

    topo = load_topology(env.paths, env.override, nvml=False)
    names = list(env.specs())
    seen: list[Any] = []
    try:
        with ProbeSet(
            names,
            topology=topo,
            watch=WatchSpec(pids={os.getpid()}),
            emit=seen.append,
            paths=env.paths,
        ) as probes:
            started = time.monotonic()
            probes.start()
            probes.run(lambda: time.monotonic() - started > env.load_s)
            probes.measure_cost(time.monotonic_ns())
            statuses = [p.status(time.monotonic_ns()) for p in probes.probes]
    except (GpujitterError, ImportError) as err:
        yield Result("load core", "fail", str(err), fix=remedies.run_as_root())
        return
    yield Result("load core", "pass", "core BPF module (watched set, CPU->node map) loaded")
    yield own_scheduling_result(env)
    for st in statuses:
        if st.state in ("running", "degraded"):
            status: Status = "pass" if st.state == "running" else "warn"
            text = f"{st.state} {st.reason}".strip() + f"; {cost_text(st)}"
            yield Result(f"load {st.probe}", status, text)
        else:
            spec = env.specs()[st.probe]
            yield Result(
                f"load {st.probe}",
                "warn",
                f"{st.state}: {st.reason}; without it {spec.degrades}",
                fix="gpujitter doctor  # the hook lines above say what is missing",
            )


def own_scheduling_result(env: DoctorEnv) -> Result:
    """--load: the daemon's own scheduling, applied to this process's threads and read back
    (a container's seccomp filter or a policy module may refuse it)."""
    own = OwnScheduling(env.paths.proc)
    own.tend(time.monotonic_ns())
    got = thread_policies(env.paths.proc, own.pid)
    wanted = {"batch"}
    src = f"{env.paths.proc}/PID/task/TID/stat"
    seen = ", ".join(sorted({f"{p} nice {n}" for p, n in got.values()}))
    if own.notes or not got or any(p not in wanted for p, _ in got.values()):
        why = "; ".join(own.notes) or f"threads run {seen or 'unread'}"
        return Result("own scheduling", "warn",
                      f"{why}: the daemon's threads may delay the watched ones "
                      "(self-inflicted gaps, counted in daemon.status self_inflicted)",
                      fix="allow sched_setscheduler and setpriority to the daemon "
                          "(seccomp profile, container runtime)", source=src)  # fmt: skip
    return Result("own scheduling", "pass",
                  f"threads run {seen} (below the watched threads; waits behind them are "
                  "counted as self-inflicted gaps)", source=src)  # fmt: skip
