"""Container, Kubernetes and Slurm awareness: cgroup layouts and runtime files on recorded
trees (containerd and CRI-O pods under both cgroup drivers, Docker, podman, Slurm v1/v2)."""

from __future__ import annotations

import argparse
import ctypes as ct
from dataclasses import replace
from datetime import UTC
from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpujitter.cli import build_parser, load_commands, main
from gpujitter.cli.options import watch_from_args
from gpujitter.cli.run import flags_of
from gpujitter.daemon.analysis.describe import evidence_line
from gpujitter.daemon.analysis.records import TaskEvidence
from gpujitter.daemon.service.config import load_config
from gpujitter.daemon.service.service import watch_of
from gpujitter.daemon.sinks import metrics
from gpujitter.daemon.sinks.trace import TraceWriter
from gpujitter.errors import GpujitterError
from gpujitter.probes import watch
from gpujitter.probes.events import WorkloadInfo, from_record, to_record
from gpujitter.probes.topology import Topology
from gpujitter.probes.watch import WHY_CGROUP, WHY_FORK, CoreBpf, WatchSpec, resolve
from gpujitter.probes.workload import (
    UNNAMED_POD,
    TaskOwners,
    Workload,
    WorkloadReader,
    label,
    matches_pod,
    matches_slurm_job,
)
from gpujitter.tui import decode
from gpujitter.tui.text import WallClock
from gpujitter.tui.views.breakdown import breakdown_text
from tests.fixtures.streams.synthetic import CONFIG, TWO_NODES, Stream, ns
from tests.unit.conftest import MakeTree
from tests.unit.test_engine import loader_chain
from tests.unit.test_hostile_names import controls
from tests.unit.trace_samples import header

CID = "3f4e" + "a1" * 30
UID = "8d1b7a52-1c2e-4f0b-9a5e-0123456789ab"
UID_ = UID.replace("-", "_")


def _oci(annotations: dict[str, str]) -> str:
    return orjson.dumps({"ociVersion": "1.1.0", "annotations": annotations}).decode()


CONTAINERD_SPEC = {
    f"run/containerd/io.containerd.runtime.v2.task/k8s.io/{CID}/config.json": _oci(
        {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-name": "trainer-0",
            "io.kubernetes.cri.sandbox-namespace": "ml",
            "io.kubernetes.cri.container-name": "pytorch",
        }
    )
}
CRIO_SPEC = {
    f"var/lib/containers/storage/overlay-containers/{CID}/userdata/config.json": _oci(
        {
            "io.kubernetes.pod.name": "infer-7f9c",
            "io.kubernetes.pod.namespace": "serving",
            "io.kubernetes.container.name": "triton",
        }
    )
}


def _cgroup(pid: int, text: str) -> dict[str, str]:
    return {f"proc/{pid}/cgroup": text}


@pytest.mark.parametrize(
    ("cgroup", "runtime_files", "want"),
    [
        (  # containerd, systemd driver, cgroup v2
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
            f"cri-containerd-{CID}.scope\n",
            CONTAINERD_SPEC,
            Workload("pod", CID, "containerd", "trainer-0", "ml", "pytorch"),
        ),
        (  # containerd, cgroupfs driver, cgroup v1: the runtime found from its files
            f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
            f"1:name=systemd:/kubepods/besteffort/pod{UID}/{CID}\n",
            CONTAINERD_SPEC,
            Workload("pod", CID, "containerd", "trainer-0", "ml", "pytorch"),
        ),
        (  # CRI-O, systemd driver, guaranteed QoS
            f"0::/kubepods.slice/kubepods-pod{UID_}.slice/crio-{CID}.scope/container\n",
            CRIO_SPEC,
            Workload("pod", CID, "cri-o", "infer-7f9c", "serving", "triton"),
        ),
        (  # plain Docker, systemd driver
            f"0::/system.slice/docker-{CID}.scope\n",
            {
                f"var/lib/docker/containers/{CID}/config.v2.json": orjson.dumps(
                    {"ID": CID, "Name": "/bench", "Config": {"Labels": {}}}
                ).decode()
            },
            Workload("container", CID, "docker", container="bench"),
        ),
        (  # Docker, cgroupfs driver, v1, files unreadable: the id alone
            f"4:cpu,cpuacct:/docker/{CID}\n",
            {},
            Workload("container", CID, "docker"),
        ),
        (  # podman
            f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope\n",
            {},
            Workload("container", CID, "podman"),
        ),
        (  # Slurm, cgroup v1
            "7:cpuset:/slurm/uid_1000/job_1234/step_0/task_0\n",
            {},
            Workload("slurm", slurm_job="1234", slurm_step="0"),
        ),
        (  # Slurm, cgroup v2
            "0::/system.slice/slurmstepd.scope/job_98765/step_batch/user/task_0\n",
            {},
            Workload("slurm", slurm_job="98765", slurm_step="batch"),
        ),
        ("0::/user.slice/user-1000.slice/session-3.scope\n", {}, None),
        # A user names the cgroups of its own delegated subtree: no job or pod there.
        (
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurm-x/job_77/step_0\n",
            {},
            None,
        ),
        (
            f"0::/user.slice/user-1000.slice/user@1000.service/k/kubepods/pod{UID}/{CID}\n",
            CONTAINERD_SPEC,
            None,
        ),
        ("0::/system.slice/slurmstepd.scope/job_\u0661\u0662/step_0\n", {}, None),  # not 0-9
    ],
    ids=[
        "containerd-systemd",
        "containerd-cgroupfs-v1",
        "crio",
        "docker",
        "docker-v1-noconfig",
        "podman",
        "slurm-v1",
        "slurm-v2",
        "none",
        "slurm-named-by-a-user",
        "pod-named-by-a-user",
        "slurm-job-of-arabic-digits",
    ],
)
def test_layouts(host_tree: MakeTree, cgroup: str, runtime_files: dict, want: Workload | None):
    paths = host_tree(files={**_cgroup(4121, cgroup), **runtime_files})
    assert WorkloadReader(paths).of(4121) == want


def test_gone_process_and_bad_runtime_file(host_tree: MakeTree):
    paths = host_tree(
        files={
            **_cgroup(7, f"0::/system.slice/docker-{CID}.scope\n"),
            f"var/lib/docker/containers/{CID}/config.v2.json": "{not json",
        }
    )
    assert WorkloadReader(paths).of(99) is None
    assert WorkloadReader(paths).of(7) == Workload("container", CID, "docker")


def test_pod_names_filled_in_once_the_runtime_writes_them(host_tree: MakeTree):
    """A pod container read before its runtime's files exist is not cached nameless."""
    cgroup = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
    paths = host_tree(files=_cgroup(5, cgroup))
    reader = WorkloadReader(paths)
    assert reader.of(5) == Workload("pod", CID, "containerd")
    assert label(reader.of(5)) == f"pod ? {CID[:12]}"
    for rel, text in CONTAINERD_SPEC.items():
        (paths.run.parent / rel).parent.mkdir(parents=True)
        (paths.run.parent / rel).write_text(text)
    assert label(reader.of(5)) == "pod ml/trainer-0/pytorch"


def test_cache_is_bounded(host_tree: MakeTree):
    files = {}
    for pid in range(1, 6):
        files.update(_cgroup(pid, f"0::/system.slice/slurmstepd.scope/job_{pid}/step_0\n"))
    reader = WorkloadReader(host_tree(files=files), max_cached=2)
    assert [reader.of(pid).slurm_job for pid in range(1, 6)] == ["1", "2", "3", "4", "5"]
    assert len(reader._cache) == 2


def test_labels_and_selectors():
    pod = Workload("pod", CID, "containerd", "trainer-0", "ml", "pytorch")
    assert label(pod) == "pod ml/trainer-0/pytorch"
    assert label(Workload("container", CID, "docker")) == f"docker {CID[:12]}"
    assert label(Workload("container", CID, "docker", container="bench")) == (
        f"docker {CID[:12]} bench"
    )
    assert label(Workload("slurm", slurm_job="1234", slurm_step="0")) == "slurm job 1234 step 0"
    assert matches_pod(pod, "trainer-0") and matches_pod(pod, "ml/trainer-0")
    assert not matches_pod(pod, "other/trainer-0") and not matches_pod(None, "trainer-0")
    slurm = Workload("slurm", slurm_job="1234")
    assert matches_slurm_job(slurm, "1234") and not matches_slurm_job(slurm, "12")


POD_CGROUP = f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n"
SLURM_CGROUP = "0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0\n"


def _procs(*entries: tuple[int, str]) -> dict[str, str]:
    files = {}
    for pid, cgroup in entries:
        files[f"proc/{pid}/cgroup"] = cgroup
        files[f"proc/{pid}/comm"] = "python\n"
        files[f"proc/{pid}/status"] = f"Name:\tpython\nTgid:\t{pid}\n"
        # field 3 the state, field 22 the start: what names the process a --pid names
        files[f"proc/{pid}/stat"] = f"{pid} (python) S {'0 ' * 18}{1000 + pid} 0\n"
    return files


def test_watch_by_pod_and_slurm_job(host_tree: MakeTree):
    paths = host_tree(
        files={
            **_procs((10, POD_CGROUP), (11, SLURM_CGROUP), (12, "0::/user.slice\n")),
            **CONTAINERD_SPEC,
        }
    )
    assert resolve(WatchSpec(pods=["trainer-0"]), paths) == {10: WHY_CGROUP}
    assert resolve(WatchSpec(pods=["ml/trainer-0"]), paths) == {10: WHY_CGROUP}
    assert resolve(WatchSpec(pods=["default/trainer-0"]), paths) == {}
    assert resolve(WatchSpec(slurm_jobs=["1234"]), paths) == {11: WHY_CGROUP}
    assert WatchSpec(pods=["ml/trainer-0"], slurm_jobs=["1234"]).describe() == (
        "pod ml/trainer-0, slurm job 1234"
    )


class _KernelMap:
    """gj_watched as bcc presents it: ctypes keys and values."""

    def __init__(self) -> None:
        self.why: dict[int, int] = {}

    def __setitem__(self, key: ct.c_uint, value: ct.c_ubyte) -> None:
        self.why[key.value] = value.value

    def __delitem__(self, key: ct.c_uint) -> None:
        del self.why[key.value]

    def items(self) -> list[tuple[ct.c_uint, ct.c_ubyte]]:
        return [(ct.c_uint(k), ct.c_ubyte(v)) for k, v in self.why.items()]


class _KernelArray(dict):  # type: ignore[type-arg]
    """gj_config as bcc presents it: ctypes keys, values read back as ctypes."""

    def __getitem__(self, key: ct.c_uint) -> ct.c_ulonglong:
        return ct.c_ulonglong(self.get(key.value, 0))

    def __setitem__(self, key: ct.c_uint, value: ct.c_ulonglong) -> None:
        super().__setitem__(key.value, value.value)


def test_joining_processes_are_announced_once_with_their_workload(host_tree: MakeTree):
    """The core says where each newly watched process runs (meta.workload), once, and says
    nothing for a process outside any container or job; a fork-followed child the kernel
    added is announced at the next refresh."""
    paths = host_tree(
        files={**_procs((10, POD_CGROUP), (11, SLURM_CGROUP), (12, "0::/user.slice\n"))}
    )
    core = CoreBpf(WatchSpec(pids={10, 12}), Topology(cpu_node={0: 0}), paths)
    table = _KernelMap()
    core.bpf = {"gj_watched": table, "gj_config": _KernelArray()}
    events: list = []
    core._emit = events.append
    core.refresh(now_ns=100)
    table.why[11] = WHY_FORK  # forked by a watched parent
    core.refresh(now_ns=200)
    core.refresh(now_ns=300)
    infos = [e for e in events if isinstance(e, WorkloadInfo)]
    assert [(e.ts_ns, e.tgid, label(e.workload)) for e in infos] == [
        (100, 10, f"pod ? {CID[:12]}"),
        (200, 11, "slurm job 1234 step 0"),
    ]
    record = to_record(infos[1])
    assert record["type"] == "meta.workload" and from_record(record) == infos[1]


def test_a_fork_followed_process_is_read_once_and_a_thread_id_goes(
    host_tree: MakeTree, monkeypatch: pytest.MonkeyPatch
):
    """What the kernel's fork hook added: a process stays watched, its /proc entry read at
    the first refresh only (not once a second per loader worker); a thread's id (its status
    names another Tgid) leaves the set."""
    files = _procs((10, "0::/user.slice\n"), (11, "0::/user.slice\n"))
    files["proc/12/status"] = "Name:\tpt_worker\nTgid:\t10\n"  # a thread of process 10
    paths = host_tree(files=files)
    core = CoreBpf(WatchSpec(pids={10}), Topology(cpu_node={0: 0}), paths)
    table = _KernelMap()
    core.bpf = {"gj_watched": table, "gj_config": _KernelArray()}
    core._emit = lambda ev: None
    read: list[int] = []
    is_process = watch._is_process
    monkeypatch.setattr(
        watch, "_is_process", lambda p, tgid: read.append(tgid) or is_process(p, tgid)
    )
    core.refresh(now_ns=100)
    table.why[11] = table.why[12] = WHY_FORK
    for now in (200, 300, 400):
        core.refresh(now_ns=now)
    assert sorted(core.watched) == [10, 11] and sorted(table.why) == [10, 11]
    assert read == [11, 12]


def test_one_process_whose_name_cannot_be_read_holds_only_itself_still(host_tree: MakeTree):
    """--comm reads every process's name on the node: one whose comm fails it alone (a
    security module's EACCES; here a directory, EISDIR) held the whole watched set still for
    as long as it ran, the job's new processes never added. What that process was watched
    for is kept, the rest followed; the core is degraded, naming it, until it reads again."""

    def process(pid: int) -> dict[str, str]:  # named `python`, and so its program
        return {**_procs((pid, "0::/user.slice\n")), f"proc/{pid}/cmdline": "python\0"}

    paths = host_tree(files={**process(100), **process(200)})
    core = CoreBpf(WatchSpec(comms=["python"]), Topology(cpu_node={0: 0}), paths)
    table = _KernelMap()
    core.bpf = {"gj_watched": table, "gj_config": _KernelArray()}
    core._emit = lambda ev: None

    def unreadable(pid: int) -> None:
        comm = paths.proc / str(pid) / "comm"
        comm.unlink()
        comm.mkdir()

    core.refresh(now_ns=100)
    assert sorted(core.watched) == [100, 200] and core.unreadable == ""
    unreadable(200)
    for pid in (300, 400):  # the job's new processes, the second as unreadable
        for name, text in process(pid).items():
            (paths.proc.parent / name).parent.mkdir(parents=True, exist_ok=True)
            (paths.proc.parent / name).write_text(text)
    unreadable(400)
    core.refresh(now_ns=200)
    assert sorted(table.why) == sorted(core.watched) == [100, 200, 300]
    assert core.unreadable.startswith(f"cannot read {paths.proc}/200 and 1 more (Is a directory)")
    assert watch.unreadable_where(core.unreadable) == f"{paths.proc}/200 and 1 more"
    assert core.status(300).state == "degraded"
    for pid in (200, 400):
        (paths.proc / str(pid) / "comm").rmdir()
        (paths.proc / str(pid) / "comm").write_text("python\n")
    core.refresh(now_ns=300)
    assert sorted(core.watched) == [100, 200, 300, 400] and core.unreadable == ""


def _info(ts_ms: float, tgid: int, **fields: str) -> WorkloadInfo:
    return WorkloadInfo(ts_ns=ns(ts_ms), tgid=tgid, workload=Workload(**fields))


TRAINER = {"kind": "pod", "container_id": CID, "runtime": "containerd", "pod": "trainer-0",
           "namespace": "ml", "container": "pytorch"}  # fmt: skip


def test_engine_labels_the_attribution_and_its_threads_from_meta_workload():
    s = loader_chain().add(
        _info(1, 100, **TRAINER),
        _info(2, 300, kind="slurm", slurm_job="1234", slurm_step="0"),
    )
    attr = s.one()
    assert attr.workload == "pod ml/trainer-0/pytorch"
    assert {r.tid: r.workload for r in attr.threads} == {
        101: "pod ml/trainer-0/pytorch",
        102: "pod ml/trainer-0/pytorch",
        301: "slurm job 1234 step 0",
        302: "slurm job 1234 step 0",
    }
    # Replay equals live: the same stream gives the same record, however often it is fed.
    assert s.one() == attr
    assert from_record(to_record(attr)) == attr


def test_engine_without_workload_events_and_past_its_bound():
    assert loader_chain().one().workload == ""
    s = loader_chain().add(_info(1, 100, **TRAINER), _info(2, 7, kind="slurm", slurm_job="9"))
    assert s.one(replace(CONFIG, max_workloads=1)).workload == ""  # forgotten, oldest first
    # No critical thread known: the first feeding process's label.
    s = Stream().add(_info(1, 100, **TRAINER)).gap(100, 140, tid_after=0)
    assert s.one().workload == "pod ml/trainer-0/pytorch"


HOSTILE_POD = "\x1b]0;pwned\x07"


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser(load_commands()).parse_args(argv)


def _labelled_trace(path: Path) -> Path:
    """A recording of the loader chain whose trainer runs in a pod with a hostile name and
    whose worker runs in a Slurm job."""
    s = loader_chain().add(
        _info(1, 100, **{**TRAINER, "pod": HOSTILE_POD}),
        _info(2, 300, kind="slurm", slurm_job="1234", slurm_step="0"),
    )
    writer = TraceWriter(path, header(topology=TWO_NODES))
    for ev in s.in_emission_order():
        writer.write(ev)
    writer.close()
    return path


def test_report_and_one_line_name_the_workload_inert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = _labelled_trace(tmp_path / "pods.gjtrace")
    assert main(["report", str(trace)]) == 0
    out = capsys.readouterr().out
    assert controls(out) == []
    line = next(x for x in out.splitlines() if x.startswith("GPU0 idle"))
    assert " in pod ml/\\x1b]0;pwned\\x07/pytorch: " in line
    # A waker in another workload says which (the trainer's own label is said once).
    assert "in pt_data_worker pid 300 tid 301 (slurm job 1234 step 0), 3 hops" in line
    assert main(["report", "--json", str(trace)]) == 0
    as_json = orjson.loads(capsys.readouterr().out)
    assert [a["workload"] for a in as_json["attributions"]] == [f"pod ml/{HOSTILE_POD}/pytorch"]


def test_tui_shows_the_labels_inert() -> None:
    a = (
        loader_chain()
        .add(
            _info(1, 100, **{**TRAINER, "pod": HOSTILE_POD}),
            _info(2, 300, kind="slurm", slurm_job="1234", slurm_step="0"),
        )
        .one()
    )
    shown = decode.attribution(to_record(a))
    assert shown.workload == "pod ml/\\x1b]0;pwned\\x07/pytorch"
    text = breakdown_text(shown.gap, shown, WallClock(tz=UTC), 60).plain
    assert controls(text) == []
    assert "in pod ml/\\x1b]0;pwned\\x07/pytorch" in text
    assert "in slurm job 1234 step 0" in text  # another workload than the critical thread's
    with pytest.raises(ValueError, match="workload"):  # not a label: the record is refused
        decode.attribution({**to_record(a), "workload": {"pod": 1}})
    # The task that ran instead, in another pod: named with its process and pod, inert.
    task = TaskEvidence(tid=555, tgid=550, comm="hog", cpus=(3,), count=2, ns=9_000_000,
                        workload=f"pod other/{HOSTILE_POD}/c")  # fmt: skip
    line = evidence_line(task, 0)
    assert line.startswith("waited behind hog (pid 550 tid 555) in pod other/\\x1b]0;")
    assert controls(line) == []


def test_pods_and_slurm_jobs_from_file_environment_and_flags(tmp_path: Path) -> None:
    path = tmp_path / "gpujitter.toml"
    path.write_text('[watch]\npods = ["ml/trainer-0", "infer-7f9c"]\nslurm_jobs = [1234]\n')
    spec = watch_of(load_config(path, environ={}))
    assert (spec.pods, spec.slurm_jobs, spec.all) == (
        ["ml/trainer-0", "infer-7f9c"],
        ["1234"],
        False,
    )
    env = {"GPUJITTER_WATCH_SLURM_JOBS": "7,8"}
    assert load_config(path, environ=env)["watch.slurm_jobs"] == ("7", "8")
    args = _parse(["run", "--pod", "serving/triton-0", "--slurm-job", "99"])
    cfg = load_config(path, environ={}, flags=flags_of(args))
    assert (cfg["watch.pods"], cfg["watch.slurm_jobs"]) == (("serving/triton-0",), ("99",))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[watch]\npods = ["Trainer_0"]\n', "watch.pods"),
        ('[watch]\npods = ["a/b/c"]\n', "NAMESPACE/NAME"),
        ('[watch]\npods = ["ml/\\u001b[2J"]\n', "watch.pods"),
        ('[watch]\nslurm_jobs = ["12a"]\n', "watch.slurm_jobs"),
        ('[watch]\nslurm_jobs = ["١٢"]\n', "digits"),
    ],
)
def test_bad_pods_and_jobs_are_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "gpujitter.toml"
    path.write_text(text)
    with pytest.raises(GpujitterError) as err:
        load_config(path, environ={})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_other_commands_watch_by_pod_and_job() -> None:
    args = _parse(["probe", "sched", "--pod", "trainer-0", "--slurm-job", "5"])
    spec = watch_from_args(args)
    assert (spec.pods, spec.slurm_jobs, spec.all) == (["trainer-0"], ["5"], False)
    with pytest.raises(GpujitterError, match="flag --slurm-job"):
        watch_from_args(_parse(["probe", "sched", "--slurm-job", "x"]))


def test_idle_time_per_pod_and_slurm_job_is_a_bounded_metric(monkeypatch) -> None:
    monkeypatch.setattr(metrics, "MAX_WORKLOADS", 2)
    m = metrics.DaemonMetrics()
    m.observe_attribution(0, [("swap_in", 0.03), ("irq", 0.01)], "pod ml/trainer-0/pytorch")
    m.observe_attribution(0, [("irq", 0.02)], "pod ml/trainer-0/sidecar")  # same pod
    m.observe_attribution(1, [("irq", 0.005)], "slurm job 1234 step 0")
    m.observe_attribution(1, [("irq", 0.5)], "pod ml/trainer-1/pytorch")  # past the bound
    m.observe_attribution(1, [("irq", 0.5)], f"docker {CID[:12]}")  # no pod, no job: none
    m.observe_attribution(1, [("irq", 0.5)], "")
    text = m.exposition().decode()
    series = {
        (s.labels["gpu"], s.labels["namespace"], s.labels["pod"], s.labels["slurm_job"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "gpujitter_workload_idle_seconds"
        for s in family.samples
    }
    assert series == pytest.approx(
        {
            ("0", "ml", "trainer-0", ""): 0.06,
            ("1", "", "", "1234"): 0.005,
            ("1", "", "_other", ""): 0.5,
        }
    )


def test_every_pod_label_has_its_idle_time_counted() -> None:
    # A pod the runtime's files did not name, or one with no container name, once had no
    # series at all: its time was in the attributions' totals and in no pod's.
    m = metrics.DaemonMetrics()
    m.observe_attribution(0, [("irq", 0.25)], f"pod ? {CID[:12]}")
    m.observe_attribution(0, [("irq", 0.5)], "pod ml/trainer-0")
    text = m.exposition().decode()
    series = {
        (s.labels["namespace"], s.labels["pod"]): s.value
        for family in text_string_to_metric_families(text)
        if family.name == "gpujitter_workload_idle_seconds"
        for s in family.samples
    }
    assert series == pytest.approx({("", UNNAMED_POD): 0.25, ("ml", "trainer-0"): 0.5})


def test_task_owners_name_a_threads_process_and_announce_its_workload_once(
    host_tree: MakeTree,
) -> None:
    """The task that ran instead is often a thread: its process comes from /proc/TID/status,
    the process's workload is said the first time it is met, and a task already gone reads
    as unknown (0) without an error."""
    paths = host_tree(
        files={
            "proc/301/status": "Name:\tworker\nTgid:\t300\nPid:\t301\n",
            "proc/300/status": "Name:\tworker\nTgid:\t300\nPid:\t300\n",
            **_cgroup(300, SLURM_CGROUP),
            "proc/7/status": "Name:\tbash\nTgid:\t7\n",
            **_cgroup(7, "0::/user.slice\n"),
        }
    )
    owners = TaskOwners(paths, max_cached=2)
    assert [owners.tgid_of(t) for t in (301, 300, 7, 999, 0)] == [300, 300, 7, 0, 0]
    first = owners.first_seen(300)
    assert first is not None and label(first) == "slurm job 1234 step 0"
    assert owners.first_seen(300) is None  # said once
    assert owners.first_seen(7) is None  # in no workload: nothing to say
    assert owners.first_seen(0) is None
