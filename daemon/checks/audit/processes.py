"""Each GPU process against its GPU: CPU affinity and memory placement on the GPU's NUMA
node, the memlock limit, and the allocator it runs. GPU processes are NVML's compute
processes, else every process with libcuda mapped, plus those named with --pid; the GPUs a
process uses come from NVML or from the /dev/nvidiaN devices it maps."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Literal

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.audit.model import AuditContext, Finding, GpuProcess, Reading, rule
from gpujitter.errors import GpujitterError
from gpujitter.probes.cuda import is_libcuda
from gpujitter.probes.host import (
    HostPaths,
    cpus_in,
    format_cpulist,
    proc_pids,
    read_foreign,
    read_name,
    read_text,
    status_fields,
)
from gpujitter.probes.nvml import Nvml
from gpujitter.probes.procfs import is_kernel_thread, mapped_files
from gpujitter.probes.topology import Topology

LIBCUDA = "libcuda.so"
NVIDIA_DEV = re.compile(r"/dev/nvidia(\d+)")
ALLOCATORS = {"libjemalloc": "jemalloc", "libtcmalloc": "tcmalloc", "libmimalloc": "mimalloc"}
ALLOCATOR_ENV = (
    "MALLOC_CONF=",
    "TCMALLOC_",
    "MIMALLOC_",
    "MALLOC_ARENA_MAX=",
    "GLIBC_TUNABLES=",
    "LD_PRELOAD=",
)
REMOTE_PAGES_LIMIT = 0.10  # share of resident pages on other nodes that is flagged


def find_gpu_processes(
    paths: HostPaths, topology: Topology, pids: Iterable[int] = (), nvml: Nvml | None = None
) -> list[GpuProcess]:
    minors = {g.minor: g.bus_id for g in topology.gpus if g.minor is not None}
    found: dict[int, tuple[set[str], str]] = {}
    if nvml is not None:
        for g in topology.gpus:
            if g.index is None:
                continue
            handle = nvml.handle(g.index)
            running = nvml.call("nvmlDeviceGetComputeRunningProcesses", handle, gpu=g.index)
            for proc in running or ():
                found.setdefault(int(proc.pid), (set(), "nvml"))[0].add(g.bus_id)
    for pid in proc_pids(paths):
        if any(is_libcuda(f) for f in mapped_files(paths, pid)):
            found.setdefault(pid, (set(), "libcuda"))
    for pid in pids:
        if not (paths.proc / str(pid) / "status").exists():
            raise GpujitterError(f"--pid {pid}: no such process")
        if is_kernel_thread(paths, pid):  # its findings (memlock, allocator) would be noise
            comm = read_name(paths.proc / str(pid) / "comm") or "?"
            raise GpujitterError(f"--pid {pid}: a kernel thread ({comm}), not a GPU process")
        found.setdefault(pid, (set(), "--pid"))
    out = []
    for pid, (gpus, how) in sorted(found.items()):
        devices = [NVIDIA_DEV.fullmatch(f) for f in mapped_files(paths, pid)]
        gpus |= {minors[int(m[1])] for m in devices if m and int(m[1]) in minors}
        comm = read_name(paths.proc / str(pid) / "comm") or "?"
        out.append(GpuProcess(pid, comm, tuple(sorted(gpus)), how))  # type: ignore[arg-type]
    return out


@rule("process.gpus")
def gpu_processes(ctx: AuditContext) -> Iterator[Finding]:
    if not ctx.processes:
        yield Finding(
            "process.gpus",
            "info",
            "GPU processes",
            "none found (no NVML compute process, no process with libcuda mapped); name one "
            "with --pid",
            (Reading(str(ctx.paths.proc / "*/maps"), f"no {LIBCUDA}"),),
        )
        return
    for p in ctx.processes:
        gpus = ", ".join(p.gpus) or "unknown GPU"
        yield Finding(
            "process.gpus",
            "info",
            _subject(p),
            f"uses {gpus} (found by {p.found_by})",
            (Reading(str(ctx.paths.proc / str(p.pid) / "maps"), gpus),),
        )


def _subject(p: GpuProcess) -> str:
    return f"pid {p.pid} ({p.comm})"


def _gpu_node(ctx: AuditContext, p: GpuProcess) -> tuple[int | None, str]:
    """The NUMA node the process should live on, or None and why it cannot be told."""
    topo = ctx.topology
    if len(topo.nodes) == 1:
        return topo.nodes[0], ""
    if not p.gpus:
        return None, "which GPU it uses is unknown"
    nodes = {topo.gpu_node.get(bus) for bus in p.gpus}
    if None in nodes:
        return None, "its GPU's NUMA node is unknown (numa_node -1)"
    if len(nodes) > 1:
        return None, f"it uses GPUs on nodes {sorted(nodes)}: no single local node"  # type: ignore[type-var]
    return nodes.pop(), ""


def _per_process(ctx: AuditContext) -> Iterator[tuple[GpuProcess, int | None, str]]:
    for p in ctx.processes:
        if not (ctx.paths.proc / str(p.pid) / "status").exists():
            continue  # exited since it was found
        node, why = _gpu_node(ctx, p)
        yield p, node, why


def _unknown_node(name: str, p: GpuProcess, why: str, ev: Reading) -> Finding:
    return Finding(name, "info", _subject(p), f"not checked: {why}", (ev,))


@rule("process.cpu_affinity")
def cpu_affinity(ctx: AuditContext) -> Iterator[Finding]:
    name = "process.cpu_affinity"
    for p, node, why in _per_process(ctx):
        status = ctx.paths.proc / str(p.pid) / "status"
        allowed_text = status_fields(ctx.paths, p.pid).get("Cpus_allowed_list", "")
        ev = Reading(str(status), f"Cpus_allowed_list: {allowed_text}")
        if node is None:
            yield _unknown_node(name, p, why, ev)
            continue
        allowed = set(cpus_in(allowed_text))
        local = ctx.topology.cpus_of(node)
        remote = sorted(allowed - set(local))
        single = " (one NUMA node: every CPU is local)" if len(ctx.topology.nodes) == 1 else ""
        if not remote:
            yield Finding(
                name, "ok", _subject(p), f"runs on node {node}'s CPUs only{single}", (ev,)
            )
            continue
        severity: Literal["warn", "critical"] = "critical" if not allowed & set(local) else "warn"
        yield Finding(
            name,
            severity,
            _subject(p),
            f"may run on CPUs {format_cpulist(remote)}, remote from its GPU's node {node}"
            + (" (it may not run on any local CPU)" if severity == "critical" else ""),
            (ev,),
            remedies.bind_process(p.pid, node, local),
        )


def _numa_pages(text: str) -> tuple[Counter[int], Counter[str]]:
    """/proc/PID/numa_maps: resident pages per node and mappings per policy."""
    pages: Counter[int] = Counter()
    policies: Counter[str] = Counter()
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        policies[fields[1]] += 1
        for f in fields[2:]:
            match = re.fullmatch(r"N(\d+)=(\d+)", f)
            if match:
                pages[int(match.group(1))] += int(match.group(2))
    return pages, policies


@rule("process.memory_policy")
def memory_policy(ctx: AuditContext) -> Iterator[Finding]:
    name = "process.memory_policy"
    for p, node, why in _per_process(ctx):
        mems = status_fields(ctx.paths, p.pid).get("Mems_allowed_list", "")
        status_ev = Reading(
            str(ctx.paths.proc / str(p.pid) / "status"), f"Mems_allowed_list: {mems}"
        )
        if node is None:
            yield _unknown_node(name, p, why, status_ev)
            continue
        if len(ctx.topology.nodes) == 1:
            yield Finding(
                name, "ok", _subject(p), "one NUMA node: all memory is local", (status_ev,)
            )
            continue
        numa_maps = ctx.paths.proc / str(p.pid) / "numa_maps"
        pages, policies = _numa_pages(read_foreign(numa_maps) or "")
        total = sum(pages.values())
        remote = sum(n for nd, n in pages.items() if nd != node)
        summary = " ".join(f"N{nd}={n}" for nd, n in sorted(pages.items())) or "no pages"
        maps_ev = Reading(
            str(numa_maps),
            f"pages {summary}; policies "
            + ", ".join(f"{pol} x{n}" for pol, n in policies.most_common()),
        )
        bound = {f"bind:{node}"} >= {pol for pol in policies if pol != "default"} and (
            policies.get("default", 0) == 0
        )
        if (mems and set(cpus_in(mems)) == {node}) or bound:
            yield Finding(
                name, "ok", _subject(p), f"memory bound to node {node}", (status_ev, maps_ev)
            )
        elif total and remote / total > REMOTE_PAGES_LIMIT:
            yield Finding(
                name,
                "warn",
                _subject(p),
                f"{100 * remote // total}% of its resident pages are off node {node}, where "
                "its GPU is",
                (status_ev, maps_ev),
                remedies.bind_process(p.pid, node, ctx.topology.cpus_of(node)),
            )
        else:
            yield Finding(
                name,
                "info",
                _subject(p),
                f"memory not bound to node {node}: its pages are local now (first touch), "
                "later allocations may land remote",
                (status_ev, maps_ev),
                remedies.launch_bound(node),
            )


@rule("process.memlock")
def memlock(ctx: AuditContext) -> Iterator[Finding]:
    name = "process.memlock"
    for p, _node, _why in _per_process(ctx):
        limits = ctx.paths.proc / str(p.pid) / "limits"
        row = next(
            (
                line
                for line in (read_text(limits) or "").splitlines()
                if line.startswith("Max locked memory")
            ),
            "",
        )
        values = row.removeprefix("Max locked memory").split()
        ev = Reading(str(limits), " ".join(row.split()) or "absent")
        if not values:
            yield Finding(name, "info", _subject(p), "limits not readable", (ev,))
        elif values[0] == "unlimited":
            yield Finding(name, "ok", _subject(p), "RLIMIT_MEMLOCK unlimited", (ev,))
        else:
            soft = int(values[0])
            yield Finding(
                name,
                "warn",
                _subject(p),
                f"RLIMIT_MEMLOCK {soft // 1024} KiB: mlock() and RDMA registration (NCCL over "
                "InfiniBand, GPUDirect) of pinned buffers are capped there",
                (ev,),
                remedies.memlock_unlimited(p.pid),
            )


@rule("process.allocator")
def allocator(ctx: AuditContext) -> Iterator[Finding]:
    name = "process.allocator"
    for p, _node, _why in _per_process(ctx):
        maps_path = ctx.paths.proc / str(p.pid) / "maps"
        libs = {f for f in mapped_files(ctx.paths, p.pid) if any(lib in f for lib in ALLOCATORS)}
        environ = ctx.paths.proc / str(p.pid) / "environ"
        env = [v for v in (read_foreign(environ) or "").split("\0") if v.startswith(ALLOCATOR_ENV)]
        env_ev = Reading(str(environ), " ".join(env) or "no allocator variables")
        if not libs:
            yield Finding(
                name,
                "info",
                _subject(p),
                "glibc malloc: arena locks and trims (madvise/munmap) can stall data-loader "
                "threads",
                (Reading(str(maps_path), "no jemalloc/tcmalloc/mimalloc mapped"), env_ev),
                remedies.allocator(),
            )
            continue
        lib = sorted(libs)[0]
        kind = next(k for prefix, k in ALLOCATORS.items() if prefix in lib)
        maps_ev = Reading(str(maps_path), lib)
        if kind == "jemalloc" and not any(v.startswith("MALLOC_CONF=") for v in env):
            yield Finding(
                name,
                "info",
                _subject(p),
                "jemalloc with default settings: no background thread, so purging runs in "
                "the allocating threads",
                (maps_ev, env_ev),
                remedies.jemalloc_conf(),
            )
        else:
            yield Finding(name, "ok", _subject(p), f"{kind} in use", (maps_ev, env_ev))
