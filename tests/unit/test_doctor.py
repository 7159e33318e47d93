"""Doctor checks on this VM's recorded tree (the passing case) with single files changed for
each failing case, NVML played back from the H200 machine, and live on this host."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpujitter.daemon.checks import doctor
from gpujitter.daemon.checks.doctor import (
    DoctorEnv,
    Result,
    access,
    can_profile,
    hooks,
    host,
    kernel,
    run_checks,
)
from gpujitter.daemon.checks.doctor.hooks import hook_problem
from gpujitter.probes import registry
from gpujitter.probes.host import HostPaths
from gpujitter.probes.nvml import Nvml, NvmlUnavailable, open_nvml
from gpujitter.probes.python_gc import interpreter_hooks, node_interpreter
from gpujitter.probes.registry import Hook
from tests.nvml_playback import PlaybackBackend
from tests.unit.conftest import MakeTree

RELEASE = "6.18.44-fc-v657"  # the kernel the dev-vm tree was recorded on
ROOT_STATUS = "Name:\tpython\nUid:\t0\t0\t0\t0\nCapEff:\t000001fffeffffff\n"
USER_STATUS = "Name:\tpython\nUid:\t1000\t1000\t1000\t1000\nCapEff:\t0000000000000000\n"
BPF_PERFMON = "Name:\tpython\nUid:\t1000\t1000\t1000\t1000\nCapEff:\t000000c000000000\n"


def one(fn: doctor.Check, env: DoctorEnv) -> Result:
    (result,) = list(fn(env))
    return result


def env_of(paths: HostPaths, **kw: object) -> DoctorEnv:
    return DoctorEnv(paths=paths, **kw)  # type: ignore[arg-type]


def test_kernel(host_tree: MakeTree) -> None:
    ok = one(kernel.check_kernel, env_of(host_tree("dev-vm")))
    assert ok == Result("kernel", "pass", f"{RELEASE} (BPF ring buffer needs >= 5.8)")
    old = host_tree("dev-vm", files={"proc/sys/kernel/osrelease": "5.4.0-42-generic\n"})
    bad = one(kernel.check_kernel, env_of(old))
    assert (bad.status, bad.fix) == ("fail", "boot a kernel >= 5.8")
    assert bad.detail.startswith("5.4.0-42-generic: the probes stream through BPF ring buffers")


def test_btf(host_tree: MakeTree) -> None:
    assert one(kernel.check_btf, env_of(host_tree("dev-vm"))).status == "pass"
    bare = host_tree("dev-vm", files={"sys/kernel/btf/vmlinux": None})
    missing = one(kernel.check_btf, env_of(bare))
    assert (missing.status, missing.fix) == (
        "warn",
        "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y",
    )


def test_tracefs(host_tree: MakeTree) -> None:
    ok = one(kernel.check_tracefs, env_of(host_tree("dev-vm")))
    assert (ok.status, ok.detail) == ("pass", "mounted at /sys/kernel/tracing")
    mounts = "proc /proc proc rw 0 0\ndebugfs /sys/kernel/debug debugfs rw 0 0\n"
    unmounted = host_tree("dev-vm", files={"proc/mounts": mounts})
    bad = one(kernel.check_tracefs, env_of(unmounted))
    assert bad.status == "fail"
    assert bad.fix == "mount -t tracefs tracefs /sys/kernel/tracing"
    elsewhere = mounts + "tracefs /sys/kernel/debug/tracing tracefs rw 0 0\n"
    moved = one(kernel.check_tracefs, env_of(host_tree("dev-vm", files={"proc/mounts": elsewhere})))
    assert moved.status == "fail" and "(mounted only at /sys/kernel/debug/tracing)" in moved.detail


def test_bcc_importable_here(host_tree: MakeTree) -> None:
    result = one(kernel.check_bcc, env_of(host_tree("dev-vm")))
    assert result.status == "pass" and result.detail.startswith("bcc 0.26")


def test_without_bcc_doctor_fails_with_the_install_command() -> None:
    """A Python that cannot import bcc: doctor says so, with the fix, and exits 1."""
    code = (
        "import sys; sys.modules['bcc'] = None\n"
        "from gpujitter.cli import main\n"
        "sys.exit(main(['doctor', '--json']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    import json

    report = json.loads(proc.stdout)
    (bcc,) = [c for c in report["checks"] if c["check"] == "bcc"]
    assert bcc["status"] == "fail" and bcc["fix"].startswith("apt-get install -y python3-bpfcc")
    assert report["ok"] is False


def headers_tree(host_tree: MakeTree, uts: str | None, source: bool = True) -> HostPaths:
    files: dict[str, str | None] = {
        "usr/src/linux-headers-6.1.0-57-amd64/Makefile": "include ../common/Makefile\n",
        "usr/src/linux-headers-6.1.0-57-common/Makefile": "# common\n",
    }
    if uts is not None:
        build = f"lib/modules/{RELEASE}/build"
        files[f"{build}/Makefile"] = "# kbuild\n"
        files[f"{build}/include/generated/utsrelease.h"] = f'#define UTS_RELEASE "{uts}"\n'
        if source:
            files[f"lib/modules/{RELEASE}/source/Makefile"] = "# source\n"
    return host_tree("dev-vm", files=files)


def test_headers(host_tree: MakeTree) -> None:
    matching = one(kernel.check_headers, env_of(headers_tree(host_tree, RELEASE)))
    assert (matching.status, matching.detail) == ("pass", f"matching headers for {RELEASE}")

    fallback = one(kernel.check_headers, env_of(headers_tree(host_tree, "6.1.0-57-amd64")))
    assert fallback.status == "warn"
    assert fallback.detail.startswith(f"fallback headers 6.1.0-57-amd64 linked for {RELEASE}")
    assert "must never be read" in fallback.detail
    assert fallback.fix.startswith(f"apt-get install -y linux-headers-{RELEASE}")

    paths = headers_tree(host_tree, None)
    absent = one(kernel.check_headers, env_of(paths))
    assert absent.status == "fail"
    assert absent.fix == (
        f"ln -sfn {paths.src}/linux-headers-6.1.0-57-amd64 /lib/modules/{RELEASE}/build && "
        f"ln -sfn {paths.src}/linux-headers-6.1.0-57-common /lib/modules/{RELEASE}/source"
    )

    split = one(kernel.check_headers, env_of(headers_tree(host_tree, RELEASE, source=False)))
    assert split.status == "fail" and "source is missing" in split.detail


@pytest.mark.parametrize(
    ("status", "expect"),
    [
        (ROOT_STATUS, ("pass", "root: may load tracing BPF programs")),
        (BPF_PERFMON, ("pass", "CAP_BPF+CAP_PERFMON: may load tracing BPF programs")),
        (
            USER_STATUS,
            ("fail", "neither root nor CAP_BPF+CAP_PERFMON: tracing BPF programs cannot be loaded"),
        ),
    ],
)
def test_privileges(host_tree: MakeTree, status: str, expect: tuple[str, str]) -> None:
    result = one(
        access.check_privileges, env_of(host_tree("dev-vm", files={"proc/self/status": status}))
    )
    assert (result.status, result.detail) == expect
    assert bool(result.fix) == (expect[0] == "fail")


@pytest.mark.parametrize(
    ("status", "paranoid", "expect"),
    [
        (ROOT_STATUS, "2", ("pass", "2 (CAP_PERFMON is not bound by it)")),
        (USER_STATUS, "-1", ("pass", "-1")),
        (USER_STATUS, "2", ("fail", "2 without CAP_PERFMON: system-wide perf events are refused")),
    ],
)
def test_perf_event_paranoid(
    host_tree: MakeTree, status: str, paranoid: str, expect: tuple[str, str]
) -> None:
    files = {"proc/self/status": status, "proc/sys/kernel/perf_event_paranoid": paranoid}
    result = one(access.check_perf_paranoid, env_of(host_tree("dev-vm", files=files)))
    assert (result.status, result.detail) == expect
    if result.status == "fail":
        assert result.fix.startswith("sysctl -w kernel.perf_event_paranoid=-1")


def test_lockdown(host_tree: MakeTree) -> None:
    assert one(access.check_lockdown, env_of(host_tree("dev-vm"))).status == "pass"
    lockdown = "sys/kernel/security/lockdown"
    integrity = host_tree("dev-vm", files={lockdown: "none [integrity] confidentiality\n"})
    assert one(access.check_lockdown, env_of(integrity)).detail == "lockdown=integrity"
    conf = host_tree("dev-vm", files={lockdown: "none integrity [confidentiality]\n"})
    assert one(access.check_lockdown, env_of(conf)).status == "fail"


def test_probe_hooks_on_the_recorded_tree(host_tree: MakeTree) -> None:
    env = env_of(host_tree("dev-vm"), specs=lambda: {"malloc": registry.get("malloc")})
    assert list(hooks.check_probe_hooks(env)) == [
        Result("probe malloc", "pass", "3 hooks available")  # 2 tracepoints, 1 uprobe
    ]


def test_a_probe_off_by_default_says_why(host_tree: MakeTree) -> None:
    off = dataclasses.replace(registry.get("malloc"), default_on=False, off_reason="costly")
    env = env_of(host_tree("dev-vm"), specs=lambda: {"malloc": off})
    assert list(hooks.check_probe_hooks(env)) == [
        Result(
            "probe malloc",
            "pass",
            "3 hooks available; off by default (costly; --probes +malloc runs it)",
        )
    ]


def test_probe_without_its_tracepoints_is_unavailable(host_tree: MakeTree) -> None:
    gone = {"sys/kernel/tracing/events/mmap_lock/mmap_lock_released/format": None}
    env = env_of(host_tree("dev-vm", files=gone), specs=lambda: {"malloc": registry.get("malloc")})
    line, verdict = list(hooks.check_probe_hooks(env))
    assert line.check == "probe malloc" and line.status == "warn"
    assert line.detail.startswith("unavailable: tracepoint mmap_lock:mmap_lock_released is not in ")
    assert "allocator stalls are not attributed" in line.detail
    assert verdict == Result(
        "probes",
        "fail",
        "no registered probe can attach on this kernel",
        fix="mount -t tracefs tracefs /sys/kernel/tracing",
    )


def test_hook_checks(host_tree: MakeTree, tmp_path: Path) -> None:
    env = env_of(host_tree("dev-vm"))
    assert hook_problem(env, Hook("tracepoint", "syscalls:sys_enter_brk")) is None
    assert hook_problem(env, Hook("tracepoint", "sched:no_such_event")).startswith("is not in ")  # type: ignore[union-attr]
    # perf events: a real perf_event_open on this kernel.
    assert hook_problem(env, Hook("perf_event", "software:page-faults-maj")) is None
    assert hook_problem(env, Hook("perf_event", "software:PAGE_FAULTS_MIN")) is None
    assert hook_problem(env, Hook("perf_event", "software:page-flips")) == (
        "is not a perf event gpujitter knows (see docs/doctor.md)"
    )
    # uprobes: resolved in this host's libraries.
    assert hook_problem(env, Hook("uprobe", "libc:malloc")) is None
    assert hook_problem(env, Hook("uprobe", "libc:no_such_symbol_here")) == (
        "cannot attach: libc has no symbol no_such_symbol_here"
    )
    assert hook_problem(env, Hook("uprobe", "libcuda:cuLaunchKernel")) == (
        "cannot attach: library libcuda is not installed"
    )
    no_uprobes = env_of(HostPaths.under(tmp_path))
    assert "no uprobe support" in hook_problem(no_uprobes, Hook("uprobe", "libc:malloc"))  # type: ignore[operator]


NODE_PYTHON = node_interpreter()


def test_usdt_markers_are_judged_in_the_nodes_interpreter(host_tree: MakeTree) -> None:
    assert interpreter_hooks(NODE_PYTHON).via == "usdt", f"{NODE_PYTHON} has no GC markers"
    env = env_of(host_tree("dev-vm"))
    assert hook_problem(env, Hook("usdt", "python:gc__start")) is None
    # A kernel whose uprobes cannot raise a semaphore: the guarded markers never fire.
    old = host_tree("dev-vm", files={"sys/devices/uprobe/format/ref_ctr_offset": None})
    assert hook_problem(env_of(old), Hook("usdt", "python:gc__start")) == (
        f"cannot attach in {NODE_PYTHON}: no GC probe for this interpreter: its markers need "
        "a USDT semaphore, which this kernel cannot raise (no uprobe ref_ctr_offset)"
    )


def test_usdt_markers_without_uprobes(tmp_path: Path) -> None:
    problem = hook_problem(env_of(HostPaths.under(tmp_path)), Hook("usdt", "python:gc__start"))
    assert problem == "cannot attach: this kernel has no uprobe support (CONFIG_UPROBE_EVENTS)"


def test_unused_hooks_are_information(host_tree: MakeTree) -> None:
    paths = host_tree("dev-vm")
    kprobes, fentry = list(hooks.check_unused_hooks(env_of(paths)))
    assert kprobes == Result(
        "kprobes",
        "info",
        "absent (CONFIG_KPROBES=n); gpujitter does not use them",
        source=str(paths.sys / "bus/event_source/devices"),
    )
    assert fentry.status == "info" and "--load tries one" in fentry.detail


def test_shared_programs_by_the_kernels_version(host_tree: MakeTree) -> None:
    links, cookies = list(hooks.check_shared_programs(env_of(host_tree("dev-vm"))))
    assert (links.check, links.status) == ("uprobe-multi links", "info")
    assert links.detail.startswith("yes (kernel 6.18; --load asks)")
    assert cookies.detail.startswith("yes (kernel 6.18; --load asks)")
    files = {"proc/sys/kernel/osrelease": "6.8.0-45-generic"}
    links, cookies = list(hooks.check_shared_programs(env_of(host_tree("dev-vm", files=files))))
    assert links.detail.startswith("yes (kernel 6.8;")
    assert cookies.detail.startswith("no (kernel 6.8;") and "pair per vector" in cookies.detail
    files = {"proc/sys/kernel/osrelease": "5.15.0-91-generic"}
    links, _ = list(hooks.check_shared_programs(env_of(host_tree("dev-vm", files=files))))
    assert links.detail.startswith("no (kernel 5.15;") and "a stop take seconds" in links.detail


def test_shared_programs_asked_of_the_kernel_with_load(
    host_tree: MakeTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what the kernel answers wins over its version; unprivileged, the version tells
    monkeypatch.setattr(hooks, "SHARED_PROGRAMS", tuple(
        (name, since, lambda since=since: since < (6, 8), spared, otherwise)
        for name, since, _, spared, otherwise in hooks.SHARED_PROGRAMS
    ))  # fmt: skip
    env = env_of(host_tree("dev-vm"), load=True)
    monkeypatch.setattr(DoctorEnv, "privileged", lambda self: "root")
    links, cookies = list(hooks.check_shared_programs(env))
    assert links.detail.startswith("yes (asked)") and cookies.detail.startswith("no (asked)")
    monkeypatch.setattr(DoctorEnv, "privileged", lambda self: None)
    _, cookies = list(hooks.check_shared_programs(env))
    assert cookies.detail.startswith("yes (kernel 6.18;")


def test_memlock(host_tree: MakeTree) -> None:
    new = one(host.check_memlock, env_of(host_tree("dev-vm")))
    assert new.status == "pass" and "charged to the memory cgroup" in new.detail
    limits = "Limit  Soft Limit  Hard Limit  Units\nMax locked memory  8388608  8388608  bytes\n"
    files = {"proc/sys/kernel/osrelease": "5.4.0-42-generic", "proc/self/limits": limits}
    old = one(host.check_memlock, env_of(host_tree("dev-vm", files=files)))
    assert (old.status, old.fix) == (
        "warn",
        "ulimit -l unlimited  # LimitMEMLOCK=infinity in the unit",
    )
    assert old.detail.startswith("RLIMIT_MEMLOCK 8192 KiB")


def test_open_files(host_tree: MakeTree) -> None:
    # With `ulimit -n 16` doctor said "profiling can run" and `run` crashed in libbcc.
    fine = one(host.check_open_files, env_of(host_tree("dev-vm")))
    assert (fine.status, fine.detail) == ("pass", "RLIMIT_NOFILE up to 20000")
    limits = "Limit  Soft Limit  Hard Limit  Units\nMax open files  16  16  files\n"
    low = one(
        host.check_open_files, env_of(host_tree("dev-vm", files={"proc/self/limits": limits}))
    )
    assert (low.status, low.fix) == ("fail", "ulimit -n 65536  # LimitNOFILE=65536 in the unit")
    assert low.detail.startswith("RLIMIT_NOFILE 16: the probes may take ")


def test_nvml_played_back_from_the_h200(host_tree: MakeTree, h200_nvml: PlaybackBackend) -> None:
    env = env_of(host_tree("h200-vm"), open_nvml=lambda: Nvml(h200_nvml).open())
    assert one(host.check_nvml, env) == Result(
        "nvml", "pass", "driver 580.159.04, 1 GPU(s): 0: NVIDIA H200 at 0000:00:06.0"
    )


def test_nvml_on_this_host(host_tree: MakeTree) -> None:
    result = one(host.check_nvml, env_of(host_tree("dev-vm")))
    try:
        open_nvml().close()
    except (NvmlUnavailable, ImportError):
        # No GPU here: a warning, never a failure.
        assert result.status == "warn"
        assert result.detail.startswith("no NVIDIA GPU on PCI (")
        assert result.fix.startswith("apt-get install -y nvidia-driver")
    else:
        assert result.status == "pass"


@pytest.mark.parametrize(
    ("current", "available", "status"),
    [
        ("tsc", "tsc kvm-clock", "pass"),
        ("kvm-clock", "kvm-clock tsc", "pass"),
        ("hpet", "hpet acpi_pm tsc", "warn"),
    ],
)
def test_clocksource(host_tree: MakeTree, current: str, available: str, status: str) -> None:
    base = "sys/devices/system/clocksource/clocksource0"
    files = {f"{base}/current_clocksource": current, f"{base}/available_clocksource": available}
    result = one(host.check_clocksource, env_of(host_tree("dev-vm", files=files)))
    assert result.status == status and result.detail.startswith(current)
    if status == "warn":
        assert (
            result.fix
            == "echo tsc > /sys/devices/system/clocksource/clocksource0/current_clocksource"
        )


def test_topology_line_names_the_override(host_tree: MakeTree, tmp_path: Path) -> None:
    plain = one(host.check_topology, env_of(host_tree("dev-vm")))
    assert plain.detail.startswith("1 node(s), 2 CPUs, 0 GPU(s) on PCI,")
    override = tmp_path / "two.toml"
    override.write_text('[nodes]\n0 = "0"\n1 = "1"\n')
    emulated = one(host.check_topology, env_of(host_tree("dev-vm"), override=override))
    assert emulated.status == "pass"
    assert f"OVERRIDE {override} in force: NUMA nodes are emulated" in emulated.detail
    override.write_text('[nodes]\n0 = "0"\n')
    broken = one(host.check_topology, env_of(host_tree("dev-vm"), override=override))
    assert (
        broken.status == "fail" and "CPUs [1] of this node are in no [nodes] entry" in broken.detail
    )


def test_checks_are_a_registry_in_print_order() -> None:
    names = [fn.__name__ for fn in doctor.CHECKS]
    assert names[:4] == ["check_kernel", "check_btf", "check_tracefs", "check_bcc"]
    assert names[-2:] == ["check_load", "check_daemon"] and len(set(names)) == len(names)


def test_live_host_can_profile() -> None:
    """This machine after setup: nothing fails (warnings for the fallback headers and the
    absent GPU are expected)."""
    results = run_checks(DoctorEnv())
    failed = [r for r in results if r.status == "fail"]
    assert failed == [] and can_profile(results)
    assert all(r.fix for r in results if r.status in ("warn", "fail"))
    assert os.geteuid() == 0 or any(r.check == "privileges" for r in results)


def test_a_check_that_cannot_read_fails_alone(
    host_tree: MakeTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    def check_unreadable(env: DoctorEnv):  # what tracefs does to a user who is not root
        yield Result("first", "pass", "read")
        raise PermissionError(13, "Permission denied", "/sys/kernel/tracing/events")

    monkeypatch.setattr(doctor, "CHECKS", [check_unreadable, kernel.check_kernel])
    first, failed, release = run_checks(env_of(host_tree("dev-vm")))
    assert first.status == "pass" and release.check == "kernel"
    assert failed == Result(
        "first",
        "fail",
        "could not be checked: Permission denied: /sys/kernel/tracing/events",
        fix="run `sudo gpujitter doctor`",
    )


def test_every_line_says_where_it_was_read(host_tree: MakeTree) -> None:
    """--json's `source` ("the file or interface a result was read from") was empty for the
    kernel, bcc, every probe, fentry, nvml and topology lines."""
    tree = host_tree("dev-vm")
    results = run_checks(env_of(tree, specs=lambda: {"malloc": registry.get("malloc")}))
    assert [r.check for r in results if not r.source] == []
    by_check = {r.check: r.source for r in results}
    assert by_check["kernel"] == str(tree.proc / "sys/kernel/osrelease")
    assert str(tree.tracefs / "events") in by_check["probe malloc"]


V1_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "35 31 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
)
V2_MOUNTS = "30 23 0:27 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def cgroup_files(member: str, mounts: str, groups: dict[str, dict[str, str]]) -> dict[str, str]:
    """A recorded tree's files for this process in a cgroup: /proc/self/cgroup (`member`),
    its mountinfo, and each cgroup directory of `groups` with its settings."""
    files = {"proc/self/cgroup": member, "proc/self/mountinfo": mounts}
    for group, settings in groups.items():
        files[f"{group}/cgroup.procs"] = ""
        files.update({f"{group}/{name}": value for name, value in settings.items()})
    return files


def test_memory_limit_under_cgroup_v1_binds_from_a_parent(host_tree: MakeTree) -> None:
    # A start in a 60 MB memory cgroup thrashed past its --duration: nothing had said so.
    unlimited = {"memory.limit_in_bytes": "9223372036854771712\n"}
    files = cgroup_files(
        "4:memory:/job/step\n3:cpu:/\n0::/\n",
        V1_MOUNTS,
        {
            "sys/fs/cgroup/memory/job/step": unlimited,  # none of its own
            "sys/fs/cgroup/memory/job": {"memory.limit_in_bytes": str(60 << 20)},
            "sys/fs/cgroup/memory": unlimited,
        },
    )
    paths = host_tree("dev-vm", files=files)
    low = one(host.check_memory_limit, env_of(paths))
    assert (low.status, low.source) == (
        "warn",
        str(paths.sys / "fs/cgroup/memory/job/memory.limit_in_bytes"),
    )
    assert low.detail.startswith("memory.limit_in_bytes 60 MiB (")
    assert "thrashes or is killed" in low.detail and "MemoryMax=1G" in low.fix


def test_memory_limit_under_cgroup_v2_takes_the_tighter_of_max_and_high(
    host_tree: MakeTree,
) -> None:
    unit = "sys/fs/cgroup/system.slice/gpujitter.service"
    files = cgroup_files(
        "0::/system.slice/gpujitter.service\n",
        V2_MOUNTS,
        {
            unit: {"memory.max": str(1 << 30), "memory.high": str(128 << 20)},
            "sys/fs/cgroup/system.slice": {"memory.max": "max\n"},
        },
    )
    paths = host_tree("dev-vm", files=files)
    high = one(host.check_memory_limit, env_of(paths))
    assert high.status == "warn" and high.detail.startswith("memory.high 128 MiB (")
    assert "the start thrashes;" not in high.detail and high.detail.endswith("the start thrashes")
    files[f"{unit}/memory.high"] = "max\n"  # the shipped unit's 512M and 1G fit
    files[f"{unit}/memory.max"] = str(1 << 30)
    roomy = host_tree("dev-vm", files=files)
    fits = one(host.check_memory_limit, env_of(roomy))
    unit_dir = roomy.sys / "fs/cgroup/system.slice/gpujitter.service"
    assert (fits.status, fits.detail) == ("pass", f"memory.max 1024 MiB ({unit_dir})")


def test_no_memory_limit_or_no_cgroup_file_system(host_tree: MakeTree) -> None:
    files = {"proc/self/cgroup": "0::/\n", "proc/self/mountinfo": V2_MOUNTS}
    tree = host_tree("dev-vm", files=files)
    none = one(host.check_memory_limit, env_of(tree))
    assert (none.status, none.detail) == (
        "pass",
        f"no memory limit on {tree.sys / 'fs/cgroup'} or above it",
    )
    # a cgroup outside the mount's root (another namespace) reads the mount point's own
    files = {
        "proc/self/cgroup": "0::/../../elsewhere\n",
        "proc/self/mountinfo": V2_MOUNTS.replace(" / /sys/fs/cgroup", " /pod/ctr /sys/fs/cgroup"),
        "sys/fs/cgroup/memory.max": str(96 << 20),
    }
    inner = one(host.check_memory_limit, env_of(host_tree("dev-vm", files=files)))
    assert inner.status == "warn" and inner.detail.startswith("memory.max 96 MiB (")
    # a group whose name only begins like the mount's root is not under it
    files["proc/self/cgroup"] = "0::/pod/ctr2\n"
    files["sys/fs/cgroup/memory.max"] = str(80 << 20)
    files["sys/fs/cgroup/../ctr2/memory.max"] = str(1 << 20)
    beside = one(host.check_memory_limit, env_of(host_tree("dev-vm", files=files)))
    assert beside.detail.startswith("memory.max 80 MiB ("), beside
    # nothing to tell the process's memory cgroup by: said, not passed as "no limit"
    garbled = {"proc/self/cgroup": "garbage", "proc/self/mountinfo": "1 2 3 / /x - \n- x"}
    unknown = one(host.check_memory_limit, env_of(host_tree("dev-vm", files=garbled)))
    assert unknown.status == "info" and unknown.detail.startswith("not checked: ")
    gone = {"proc/self/cgroup": "", "proc/self/mountinfo": ""}
    assert one(host.check_memory_limit, env_of(host_tree("dev-vm", files=gone))).status == "info"


def test_memory_limit_reads_mountinfo_s_escapes(host_tree: MakeTree) -> None:
    # mountinfo writes a space in a path as \040 and a backslash as \134 (/proc/self/cgroup
    # leaves both as they are): a hierarchy mounted at a path with a space read as "no
    # limit", and a container's root named with systemd's \x2d was no prefix of its groups.
    mounts = (
        "35 31 0:31 /ctr\\134x2d1.scope /sys/fs/cgroup/mem\\040ory rw - cgroup cgroup rw,memory\n"
    )
    files = cgroup_files(
        "4:memory:/ctr\\x2d1.scope/job\n",
        mounts,
        {
            "sys/fs/cgroup/mem ory/job": {"memory.limit_in_bytes": str(60 << 20)},
            "sys/fs/cgroup/mem ory": {"memory.limit_in_bytes": str(100 << 20)},
        },
    )
    low = one(host.check_memory_limit, env_of(host_tree("dev-vm", files=files)))
    assert low.status == "warn" and low.detail.startswith("memory.limit_in_bytes 60 MiB ("), low
