"""Each GPU process against its GPU: CPU affinity and memory placement on the GPU's NUMA
node, the memlock limit, and the allocator it runs. GPU processes are NVML's compute
processes, else every process with libcuda mapped, plus those named with --pid; the GPUs a
process uses come from NVML or from the /dev/nvidiaN devices it maps."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Literal

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.audit.model import (
    AuditContext,
    Finding,
    GpuProcess,
    Reading,
    not_readable,
    read_process_file,
    rule,
    why_unreadable,
)
from gpujitter.errors import GpujitterError
from gpujitter.probes.cuda import is_libcuda
from gpujitter.probes.host import (
    HostPaths,
    cpus_in,
    decimal,
    format_cpulist,
    proc_pids,
    read_name,
    read_text,
    status_fields,
)
from gpujitter.probes.nvml import Nvml
from gpujitter.probes.procfs import is_kernel_thread, mapped_files, read_mapped_files
from gpujitter.probes.topology import Topology

LIBCUDA = "libcuda.so"
NVIDIA_DEV = re.compile(r"/dev/nvidia([0-9]{1,10})")
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
SHOWN_PIDS = 5  # unreadable processes named in the evidence; the rest are counted


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
        status = status_fields(paths, pid)
        # /proc/TID exists for every thread though `ls /proc` lists only processes.
        tgid = status.get("Tgid", str(pid))
        if tgid != str(pid):
            raise GpujitterError(f"--pid {pid}: a thread of process {tgid}; give the process")
        # A zombie has no memory, maps or threads left: every finding on it would be noise.
        if status.get("State", "").startswith(("Z", "X")):
            raise GpujitterError(f"--pid {pid}: exited (a zombie its parent has not reaped)")
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


def _maps_access(paths: HostPaths) -> tuple[int, list[int], str]:
    """How many processes' maps this user may open, the pids whose maps it may not, and why:
    the libcuda scan is blind to those (another user's, to all but root). procfs checks
    access when maps is opened, so an open tells without reading every process twice."""
    readable, refused, why = 0, [], ""
    for pid in proc_pids(paths):
        try:
            os.close(os.open(paths.proc / str(pid) / "maps", os.O_RDONLY | os.O_NONBLOCK))
        except FileNotFoundError:
            continue  # exited since it was listed
        except OSError as err:
            refused.append(pid)
            why = why or why_unreadable(err)
        else:
            readable += 1
    return readable, refused, why


@rule("process.gpus")
def gpu_processes(ctx: AuditContext) -> Iterator[Finding]:
    readable, refused, why = _maps_access(ctx.paths)
    shown = ", ".join(map(str, refused[:SHOWN_PIDS])) + (" …" if len(refused) > SHOWN_PIDS else "")
    counted = f"{readable} readable, {len(refused)} not readable (pids {shown})"
    if not ctx.processes and refused:
        yield Finding(
            "process.gpus",
            "info",
            "GPU processes",
            f"none found among the {readable} process(es) whose maps were readable (no NVML "
            f"compute process, no process with libcuda mapped); the maps of {len(refused)} "
            f"process(es) not readable ({why}), or name one with --pid",
            (Reading(str(ctx.paths.proc / "*/maps"), f"no {LIBCUDA} in {counted}"),),
        )
        return
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
    if refused:
        yield Finding(
            "process.gpus",
            "info",
            "GPU processes",
            f"the maps of {len(refused)} process(es) not readable ({why}): GPU processes among "
            "them are found only by NVML or --pid",
            (Reading(str(ctx.paths.proc / "*/maps"), counted),),
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
        if status_fields(ctx.paths, p.pid).get("State", "Z").startswith(("Z", "X")):
            continue  # exited since it was found (a zombie too: nothing of it is left to audit)
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
            match = re.fullmatch(r"N([0-9]{1,10})=([0-9]{1,20})", f)
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
        bound_by_mems = bool(mems) and set(cpus_in(mems)) == {node}
        try:
            pages, policies = _numa_pages(read_process_file(numa_maps))
        except OSError as err:
            # Mems_allowed alone can tell "bound"; anything else rests on the pages.
            yield Finding(
                name,
                "ok" if bound_by_mems else "info",
                _subject(p),
                f"memory bound to node {node}"
                if bound_by_mems
                else f"not checked: its numa_maps not readable ({why_unreadable(err)})",
                (status_ev, not_readable(numa_maps, err)),
            )
            continue
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
        if bound_by_mems or bound:
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
        soft = decimal(values[0]) if values else None
        if values and values[0] == "unlimited":
            yield Finding(name, "ok", _subject(p), "RLIMIT_MEMLOCK unlimited", (ev,))
        elif soft is None:
            yield Finding(name, "info", _subject(p), "limits not readable", (ev,))
        else:
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
        environ = ctx.paths.proc / str(p.pid) / "environ"
        try:
            files = read_mapped_files(ctx.paths, p.pid)
        except OSError as err:
            yield Finding(
                name,
                "info",
                _subject(p),
                f"not checked: its maps not readable ({why_unreadable(err)})",
                (not_readable(maps_path, err),),
            )
            continue
        libs = {f for f in files if any(lib in f for lib in ALLOCATORS)}
        env: list[str] | None
        try:
            env = [v for v in read_process_file(environ).split("\0") if v.startswith(ALLOCATOR_ENV)]
            env_ev = Reading(str(environ), " ".join(env) or "no allocator variables")
        except OSError as err:
            env, env_ev = None, not_readable(environ, err)
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
        configured = None if env is None else any(v.startswith("MALLOC_CONF=") for v in env)
        if kind == "jemalloc" and configured is None:
            yield Finding(
                name,
                "info",
                _subject(p),
                "jemalloc in use; its settings (MALLOC_CONF) not checked: its environ not readable",
                (maps_ev, env_ev),
            )
        elif kind == "jemalloc" and not configured:
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
