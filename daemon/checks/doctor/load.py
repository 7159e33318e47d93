"""`doctor --load`: the core BPF module and every probe really loaded for a moment, each
one's measured cost and what the start took, the daemon's own scheduling applied and read
back, and a daemon running on the node in its own words (its status record)."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator
from typing import Any

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.doctor.model import DoctorEnv, Result, Status, check
from gpujitter.daemon.service.own_scheduling import OwnScheduling, thread_policies
from gpujitter.daemon.service.status import DaemonStatus, ProbeCost
from gpujitter.daemon.sinks.stream import first_records
from gpujitter.errors import GpujitterError
from gpujitter.probes.base import compile_blocked
from gpujitter.probes.events import ProbeStatus
from gpujitter.probes.host import format_cpulist
from gpujitter.probes.topology import load_topology
from gpujitter.text import printable

# How long a daemon may take to send a new client its hello and snapshot.
DAEMON_TIMEOUT_S = 2.0
# A daemon's probe by its state: one the daemon was told not to run, or that this node
# cannot run (no GPU for NVML), is not a fault of the daemon; the checks above say why.
PROBE_VERDICTS: dict[str, Status] = {"running": "pass", "off": "info", "unavailable": "info"}


def cost_text(st: ProbeStatus | ProbeCost) -> str:
    """A probe's measured BPF cost in one phrase (an idle node's: its own background), and
    what it delivered and lost, whether or not its cost could be measured."""
    delivered = f"{st.events} events, {st.lost_kernel + st.lost_user} lost"
    if st.cost_from.startswith("with "):
        return f"BPF cost counted {st.cost_from} (the programs are shared), {delivered}"
    if st.cost_from == "pending":
        return (f"BPF cost not measured yet (its programs came after the last sampled "
                f"second; the next is within a minute), {delivered}")  # fmt: skip
    if st.bpf_ns_per_s < 0:
        return f"BPF cost not measured (statistics refused, or no BPF programs), {delivered}"
    per_run = st.bpf_ns_per_s / st.bpf_runs_per_s if st.bpf_runs_per_s > 0 else 0
    return (
        f"BPF {st.bpf_runs_per_s} runs/s, {per_run:.0f} ns/run, "
        f"{st.bpf_ns_per_s / 1e7:.3f}% of a CPU ({st.cost_from}), {delivered}"
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
            before = _cpu_s()
            started = time.monotonic()
            probes.start()
            start_s, start_cpu_s = time.monotonic() - started, _cpu_s() - before
            started = time.monotonic()
            probes.run(lambda: time.monotonic() - started > env.load_s)  # its last tick measures
            statuses = [p.status(time.monotonic_ns()) for p in probes.probes]
            core = probes.core.status(time.monotonic_ns())
    except (GpujitterError, ImportError) as err:
        # Privilege is the cure unless the process's surroundings stop the compile (a deleted
        # current folder, few descriptors): the message names those, and root would not help.
        fix = "" if compile_blocked() is not None else remedies.run_as_root()
        yield Result("load core", "fail", str(err), fix=fix)
        return
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10  # KiB on Linux
    yield Result("load core", "pass",
                 f"core BPF module (watched set, CPU->node map) loaded; {len(statuses)} probes "
                 f"started in {start_s:.1f} s, {start_cpu_s:.1f} CPU-s, this process's peak "
                 f"resident {peak_mib} MiB (what a daemon's start takes here); "
                 f"{cost_text(core)}")  # fmt: skip
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


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@check
def check_daemon(env: DoctorEnv) -> Iterator[Result]:
    """--load: the daemon running on this node, as its status record says: what it costs
    (CPU, memory, each probe's BPF time) and whether it keeps up (events lost, gaps its own
    threads caused)."""
    if not env.load or env.socket is None:
        return
    src = str(env.socket)
    try:
        got = first_records(env.socket, ("hello", "snapshot"), DAEMON_TIMEOUT_S)
    except (FileNotFoundError, ConnectionRefusedError):
        yield Result("daemon", "info", f"no daemon listening at {src}", source=src)
        return
    except PermissionError:
        yield Result("daemon", "warn", f"the daemon's socket {src} shuts this user out",
                     fix="run as root, or as a member of the daemon's socket.group",
                     source=src)  # fmt: skip
        return
    except OSError as err:
        yield Result("daemon", "info", f"cannot reach a daemon at {src}: {err.strerror or err}",
                     source=src)  # fmt: skip
        return
    except GpujitterError as err:  # it answered, and refused (too many clients, out of fds)
        yield Result("daemon", "warn", str(err), source=src)
        return
    record = got.get("snapshot", {}).get("status")
    if not isinstance(record, dict):
        yield Result("daemon", "warn",
                     f"the daemon at {src} sent no status within {DAEMON_TIMEOUT_S:.0f} s",
                     fix="journalctl -u gpujitter -n 50  # what the daemon said last",
                     source=src)  # fmt: skip
        return
    try:
        status = DaemonStatus.from_record(record)
    except (TypeError, ValueError) as err:  # another version's, or not a daemon's at all
        yield Result("daemon", "warn", f"the daemon at {src} sent a status this doctor cannot "
                                       f"read ({err})",
                     fix="gpujitter --version  # the doctor and the daemon should be one "
                         "version", source=src)  # fmt: skip
        return
    yield _daemon_result(status, got.get("hello", {}), src)
    for probe, cost in sorted(status.probe_cost.items()):
        verdict: Status = PROBE_VERDICTS.get(cost.state, "warn")
        yield Result(f"daemon {probe}", verdict, f"{cost.state}; {cost_text(cost)}", source=src)


def _daemon_result(st: DaemonStatus, hello: dict[str, Any], src: str) -> Result:
    lost = st.lost_kernel + st.lost_user
    who = f"pid {hello['pid']}" if isinstance(hello.get("pid"), int) else "a daemon"
    version = f" ({printable(hello['version'])})" if isinstance(hello.get("version"), str) else ""
    cpus = format_cpulist(st.own_cpus) if st.own_cpus else "any"
    own = (
        f"{st.self_inflicted} self-inflicted"
        if st.self_inflicted >= 0
        else "self-inflicted not counted (an older daemon)"
    )
    text = (
        f"{who}{version}: {st.cpu_percent:.1f}% of a CPU, {st.rss_bytes >> 20} MiB resident, "
        f"{st.events_per_s:.0f} events/s, {lost} lost ({st.lost_kernel} in the kernel, "
        f"{st.lost_user} in user space), {st.attributions} gaps attributed, {own}; its "
        f"threads at nice {st.own_nice} on CPUs {cpus}"
    )
    if st.self_inflicted > 0:
        return Result("daemon", "warn", text,
                      fix="leave the daemon a CPU the watched job may not use (taskset -c or "
                          "the job's cpuset); it moves there by itself", source=src)  # fmt: skip
    if lost > 0:
        return Result("daemon", "warn", text,
                      fix="leave the daemon a CPU the watched job may not use (it is starved), "
                          "or add the probe losing most (below) to probes.disable in "
                          "/etc/gpujitter/gpujitter.toml", source=src)  # fmt: skip
    return Result("daemon", "pass", text, source=src)


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
