"""Which container, Kubernetes pod or Slurm job a process belongs to: read from its cgroup path
(/proc/PID/cgroup) and the container runtime's own state files, with no cluster API.

A registry of cgroup path layouts (kubepods under the systemd and cgroupfs drivers, Docker,
podman, Slurm under cgroup v1 and v2) names the container id or the job and step; a registry
of runtime readers (containerd, CRI-O, Docker) turns a container id into its pod, namespace
and container name. Results are cached per /proc/PID/cgroup text (bounded), so a process
costs one small read once its cgroups have been seen.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from gpujitter.probes.host import HostPaths, read_text, status_fields
from gpujitter.probes.procfs import read_while_alive


@dataclass(frozen=True, slots=True)
class Workload:
    """kind: pod, container (a runtime's container outside Kubernetes) or slurm.
    runtime: containerd, cri-o, docker, podman ("" unknown). slurm_step: 0, 1, batch,
    extern, interactive ... as slurmstepd names its cgroup."""

    kind: str
    container_id: str = ""
    runtime: str = ""
    pod: str = ""
    namespace: str = ""
    container: str = ""
    slurm_job: str = ""
    slurm_step: str = ""


def label(w: Workload) -> str:
    """The short name records carry: 'pod ns/name/container', 'docker 0123456789ab',
    'slurm job 1234 step 0' ('' for a process in none of these)."""
    if w.kind == "slurm":
        step = f" step {w.slurm_step}" if w.slurm_step else ""
        return f"slurm job {w.slurm_job}{step}"
    short = w.container_id[:12]
    if w.kind == "pod":
        if w.pod:
            name = "/".join(x for x in (w.namespace or "?", w.pod, w.container) if x)
            return f"pod {name}"
        return f"pod ? {short}"  # the runtime's files were not readable
    if w.kind == "container":
        named = f" {w.container}" if w.container else ""
        return f"{w.runtime or 'container'} {short}{named}"
    return ""


def scope_of(text: str) -> tuple[str, str, str]:
    """(namespace, pod, slurm_job) of a label that names a pod or a Slurm job, ("", "", "")
    for any other: what metrics may carry (a container id alone is too many series). A pod
    whose name could not be read ('pod ? ID') is UNNAMED_POD: its time still counts."""
    kind, _, rest = text.partition(" ")
    if kind == "pod" and rest:
        if rest.startswith("? "):
            return "", UNNAMED_POD, ""
        namespace, slash, rest = rest.partition("/")  # namespace/pod[/container]
        return (namespace, rest.partition("/")[0], "") if slash else ("", namespace, "")
    if text.startswith("slurm job ") and (job := text.split(" ")[2]):
        return "", "", job
    return "", "", ""


UNNAMED_POD = "_unnamed"  # scope_of's pod for a pod its runtime's files did not name


# ---------------------------------------------------------------------------------------
# Cgroup path layouts: (pattern, builder). The first that matches a path names its workload.

_ID = r"[0-9a-f]{64}"
_RUNTIME_PREFIX = {"cri-containerd": "containerd", "crio": "cri-o", "docker": "docker"}


def _kubepods(m: re.Match[str]) -> Workload:
    return Workload("pod", m["id"], _RUNTIME_PREFIX.get(m["prefix"] or "", ""))


def _container(runtime: str) -> Callable[[re.Match[str]], Workload]:
    return lambda m: Workload("container", m["id"], runtime)


def _slurm(m: re.Match[str]) -> Workload:
    return Workload("slurm", slurm_job=m["job"], slurm_step=m["step"] or "")


LAYOUTS: tuple[tuple[re.Pattern[str], Callable[[re.Match[str]], Workload]], ...] = (
    # systemd driver: .../kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope;
    # cgroupfs driver: /kubepods/burstable/pod<uid>/<id>
    (
        re.compile(rf"/kubepods\b.*pod[0-9a-f_-]{{32,}}(?:\.slice)?/(?:(?P<prefix>cri-containerd|crio|docker)-)?(?P<id>{_ID})(?:\.scope)?(?:/|$)"),
        _kubepods,
    ),
    (re.compile(rf"/docker[-/](?P<id>{_ID})(?:\.scope)?(?:/|$)"), _container("docker")),
    (re.compile(rf"/libpod-(?P<id>{_ID})(?:\.scope)?(?:/|$)"), _container("podman")),
    (re.compile(rf"/cri-containerd-(?P<id>{_ID})\.scope(?:/|$)"), _container("containerd")),
    (re.compile(rf"/crio-(?P<id>{_ID})\.scope(?:/|$)"), _container("cri-o")),
    # v1: /slurm/uid_N/job_J/step_S/task_T; v2: /system.slice/slurmstepd.scope/job_J/step_S/...
    (re.compile(r"/slurm[^/]*/(?:uid_[0-9]+/)?job_(?P<job>[0-9]+)(?:/step_(?P<step>[^/]+))?"),
     _slurm),
)  # fmt: skip
# A systemd user manager's subtree, which it delegates to its user: cgroups made there are
# named by that user, who could call one kubepods or job_77 and have its processes watched
# as that pod's or that job's (--pod, --slurm-job) and counted in their metrics.
_DELEGATED = re.compile(r"/user@[0-9]+\.service(?:/|$)")


def from_cgroup_path(path: str) -> Workload | None:
    """The workload a cgroup path names, without its runtime's names (None: none). No pod
    or Slurm job is named below a user manager's delegated subtree (a rootless container
    there is still one)."""
    for pattern, build in LAYOUTS:
        m = pattern.search(path)
        if m:
            w = build(m)
            if w.kind in ("pod", "slurm") and _DELEGATED.search(path, 0, m.start() + 1):
                return None
            return w
    return None


def cgroup_paths(text: str) -> list[str]:
    """The paths of a /proc/PID/cgroup file, the v2 line ("0::/...") first."""
    v2: list[str] = []
    v1: list[str] = []
    # Lines end at "\n" only: the kernel writes a cgroup's name raw, and one holding \f or
    # U+2028 read as two lines, the second a made-up "0::" path.
    for line in text.split("\n"):
        hier, _, rest = line.partition(":")
        _, sep, path = rest.partition(":")
        if sep:
            (v2 if hier == "0" else v1).append(path)
    return v2 + v1


# ---------------------------------------------------------------------------------------
# Runtime readers: container id -> pod, namespace, container name, from the runtime's files.

# Kubernetes annotations or labels, per runtime: (pod, namespace, container).
_CRI_KEYS = (
    "io.kubernetes.cri.sandbox-name",
    "io.kubernetes.cri.sandbox-namespace",
    "io.kubernetes.cri.container-name",
)
_KUBE_KEYS = (
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.container.name",
)
_CONTAINERD_TASKS = "containerd/io.containerd.runtime.v2.task/k8s.io"


def _read_json(path: Path) -> dict[str, Any]:
    text = read_text(path)
    if text is None:
        return {}
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _names(tags: Any, keys: tuple[str, str, str]) -> dict[str, str]:
    if not isinstance(tags, dict):
        return {}
    fields = ("pod", "namespace", "container")
    return {f: tags[k] for f, k in zip(fields, keys, strict=True) if isinstance(tags.get(k), str)}


def _containerd(paths: HostPaths, cid: str) -> dict[str, str] | None:
    spec = _read_json(paths.run / _CONTAINERD_TASKS / cid / "config.json")
    return _names(spec.get("annotations"), _CRI_KEYS) if spec else None


def _crio(paths: HostPaths, cid: str) -> dict[str, str] | None:
    userdata = paths.var / "lib/containers/storage/overlay-containers" / cid / "userdata"
    spec = _read_json(userdata / "config.json")
    return _names(spec.get("annotations"), _KUBE_KEYS) if spec else None


def _docker(paths: HostPaths, cid: str) -> dict[str, str] | None:
    doc = _read_json(paths.var / "lib/docker/containers" / cid / "config.v2.json")
    if not doc:
        return None
    config = doc.get("Config")
    found = _names(config.get("Labels") if isinstance(config, dict) else None, _KUBE_KEYS)
    if not found and isinstance(doc.get("Name"), str):
        found = {"container": doc["Name"].lstrip("/")}
    return found


RUNTIMES: dict[str, Callable[[HostPaths, str], dict[str, str] | None]] = {
    "containerd": _containerd,
    "cri-o": _crio,
    "docker": _docker,
}


def _named(w: Workload, paths: HostPaths) -> Workload:
    """The workload with the names its runtime's files give (the runtime found by trying
    each where the cgroup path does not say which it is)."""
    if not w.container_id:
        return w
    order = [w.runtime] if w.runtime in RUNTIMES else list(RUNTIMES)
    for runtime in order:
        names = RUNTIMES[runtime](paths, w.container_id)
        if names is not None:
            return replace(w, runtime=runtime, **names)
    return w


class WorkloadReader:
    """A process's workload, with a bounded cache per /proc/PID/cgroup text (most processes
    share a few): a process costs one raw read once its cgroups have been seen, the
    runtime's files are read once per container."""

    def __init__(self, paths: HostPaths, max_cached: int = 4096) -> None:
        self.paths = paths
        self.max_cached = max_cached
        self._cache: OrderedDict[bytes, Workload | None] = OrderedDict()

    def of(self, pid: int) -> Workload | None:
        """The workload of a process; None when it is in none, or gone, or its cgroup file
        cannot be read."""
        try:
            return self.read(pid)
        except OSError:
            return None

    def read(self, pid: int) -> Workload | None:
        """of(), None only where the process is in none or has ended: OSError where its
        cgroup file cannot be read for another reason (out of descriptors), which says
        nothing of where it runs (read_while_alive)."""
        raw = read_while_alive(f"{self.paths.proc}/{pid}/cgroup")
        if not raw:
            return None
        if raw in self._cache:
            self._cache.move_to_end(raw)
            return self._cache[raw]
        found = self._parse(raw.decode(errors="replace"))
        if found is not None and found.kind == "pod" and not found.pod:
            return found  # the runtime may not have written its files yet: not cached
        self._cache[raw] = found
        if len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return found

    def _parse(self, text: str) -> Workload | None:
        for path in cgroup_paths(text):
            w = from_cgroup_path(path)
            if w is not None:
                return _named(w, self.paths)
        return None


class TaskOwners:
    """The process, and its workload, of tasks that evidence names but nobody watches (the
    task that held a CPU while a watched thread waited for it): a thread id's process from
    /proc/TID/status, cached (bounded); each process's workload announced once."""

    def __init__(self, paths: HostPaths, max_cached: int = 4096) -> None:
        self.paths = paths
        self.max_cached = max_cached
        self.workloads = WorkloadReader(paths, max_cached)
        self._tgid: OrderedDict[int, int] = OrderedDict()
        self._announced: OrderedDict[int, None] = OrderedDict()

    def tgid_of(self, tid: int) -> int:
        """The process of a task (0: gone, or no task). A tid reused by another process
        before the cache forgets it is named as the first: the risk of a bounded cache."""
        if tid <= 0:
            return 0
        if tid in self._tgid:
            self._tgid.move_to_end(tid)
            return self._tgid[tid]
        tgid = int(status_fields(self.paths, tid).get("Tgid", "0") or "0")
        if tgid:
            _remember(self._tgid, tid, tgid, self.max_cached)
        return tgid

    def first_seen(self, tgid: int) -> Workload | None:
        """The workload of a process met for the first time (None: met before, or in none)."""
        if tgid <= 0 or tgid in self._announced:
            return None
        _remember(self._announced, tgid, None, self.max_cached)
        return self.workloads.of(tgid)


def _remember(cache: OrderedDict[int, Any], key: int, value: Any, most: int) -> None:
    cache[key] = value
    if len(cache) > most:
        cache.popitem(last=False)


def matches_pod(w: Workload | None, selector: str) -> bool:
    """Does a workload belong to the pod NAME or NAMESPACE/NAME?"""
    if w is None or w.kind != "pod" or not w.pod:
        return False
    namespace, sep, name = selector.rpartition("/")
    return w.pod == name and (not sep or w.namespace == namespace)


def matches_slurm_job(w: Workload | None, job: str) -> bool:
    return w is not None and w.kind == "slurm" and w.slurm_job == job
