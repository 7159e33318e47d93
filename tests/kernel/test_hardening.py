"""The unit's sandbox, option by option, with the real probes attached under it.

systemd is not PID 1 here, so a unit cannot be started: each option is emulated in a child
process the way systemd applies it before execve (same mount tables, seccomp rules, bounding
set and prctls; libseccomp through ctypes), and a real load runs under it: `gpujitter probe`
with every registered probe (compiles and attaches BPF), bcc hooks the other probes need
(a per-process uprobe on another user's program, a per-CPU perf event, a tracepoint, a ring
buffer delivered through a ctypes callback) and the daemon's plumbing (stream socket with a
group, metrics on localhost, sd_notify, files in the state and log directories, another
user's /proc entries). Each option must leave the load as it is without a sandbox, and a
control must show the option really is in force. Then: the whole unit at once, each
capability of the bounding set shown necessary, and the options left out shown breaking.

Every test here runs its children under the shared lock (see PREAMBLE); the test runner's
own namespace and credentials are never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import errno
import grp
import json
import os
import pwd
import resource
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpujitter.probes.events import CORE_PROBE

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "systemd" / "gpujitter.service"
EXAMPLE_CONFIG = REPO / "systemd" / "gpujitter.toml"

# ---------------------------------------------------------------------------------------
# Kernel and libc interfaces (ctypes): mount namespaces, prctl, seccomp.

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWUSER = 0x00020000, 0x04000000, 0x10000000
# CLONE_NEWCGROUP, NEWNS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWUTS, NEWTIME
NAMESPACE_FLAGS = (0x02000000, CLONE_NEWNS, 0x08000000, CLONE_NEWUSER, 0x20000000, 0x40000000)
NAMESPACE_FLAGS += (CLONE_NEWUTS, 0x00000080)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
PER_MOUNT_FLAGS = {
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP, PR_SET_MDWE, PR_GET_MDWE = 38, 24, 65, 66
PR_MDWE_REFUSE_EXEC_GAIN = 1
PROT_WRITE, PROT_EXEC = 2, 4
SHM_EXEC = 0o100000
S_ISUID, S_ISGID = 0o4000, 0o2000
O_CREAT = 0o100
SCHED_RESET_ON_FORK = 0x40000000
AF_MAX = 46

SCMP_ACT_KILL_PROCESS, SCMP_ACT_ALLOW = 0x80000000, 0x7FFF0000
SCMP_FLTATR_ACT_BADARCH, SCMP_FLTATR_CTL_NNP = 2, 3
SCMP_CMP_NE, SCMP_CMP_GE, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 1, 5, 4, 7


def scmp_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _syscall_ok(ret: int, what: str) -> None:
    if ret < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    enc = [None if s is None else s.encode() for s in (source, target, fstype)]
    ret = _libc.mount(enc[0], enc[1], enc[2], flags, data.encode() or None)
    _syscall_ok(ret, f"mount {target}")


def _prctl(option: int, arg: int = 0) -> int:
    ret = _libc.prctl(option, arg, 0, 0, 0)
    _syscall_ok(ret, f"prctl {option}")
    return int(ret)


# ---------------------------------------------------------------------------------------
# What each unit option does, as data: mount entries, seccomp filters, capabilities.

RO, RW, RW_IMPLICIT, INACCESSIBLE, TMPFS, PRIVATE_DEV, PROC_SUBSET_PID = (
    "ro",
    "rw",
    "rw-implicit",
    "inaccessible",
    "tmpfs",
    "private-dev",
    "proc-subset-pid",
)
# When two options name the same path, the more restrictive wins (systemd's order).
_MODE_RANK = {INACCESSIBLE: 0, PRIVATE_DEV: 1, PROC_SUBSET_PID: 1, TMPFS: 2, RO: 3, RW: 4}
_MODE_RANK[RW_IMPLICIT] = 5


@dataclass(frozen=True, slots=True)
class MountEntry:
    path: str
    mode: str
    optional: bool = True  # a missing path is skipped


def _entries(mode: str, *paths: str, optional: bool = True) -> list[MountEntry]:
    return [MountEntry(p, mode, optional) for p in paths]


# systemd's namespace tables (src/core/namespace.c), for the values the unit uses.
KERNEL_TUNABLES = [
    *_entries(RO, "/proc/acpi", "/proc/apm", "/proc/asound", "/proc/bus", "/proc/fs"),
    *_entries(RO, "/proc/irq", "/proc/latency_stats", "/proc/mtrr", "/proc/scsi"),
    *_entries(RO, "/proc/sys", "/proc/sysrq-trigger", "/proc/timer_stats"),
    *_entries(INACCESSIBLE, "/proc/kallsyms", "/proc/kcore"),
    MountEntry("/sys", RO, False),
    *_entries(RO, "/sys/fs/bpf", "/sys/kernel/debug", "/sys/kernel/tracing"),
    *_entries(RW_IMPLICIT, "/sys/fs/cgroup", "/sys/fs/selinux"),
]
PROTECT_SYSTEM_STRICT = [
    MountEntry("/", RO, False),
    *_entries(RW_IMPLICIT, "/proc", "/sys", "/dev", optional=False),
    *_entries(RW_IMPLICIT, "/home", "/run/user", "/root"),
]


def mount_entries(settings: dict[str, str]) -> list[MountEntry]:
    get = settings.get
    out: list[MountEntry] = []
    if get("ProtectSystem") == "strict":
        out += PROTECT_SYSTEM_STRICT
        # The unit's own directories stay writable (systemd binds them read-write).
        for key, root in (("StateDirectory", "/var/lib"), ("LogsDirectory", "/var/log")):
            if key in settings:
                out.append(MountEntry(f"{root}/{settings[key]}", RW, False))
        if "RuntimeDirectory" in settings:
            out.append(MountEntry(f"/run/{settings['RuntimeDirectory']}", RW, False))
    if get("ProtectHome") == "read-only":
        out += _entries(RO, "/home", "/run/user", "/root")
    if get("PrivateTmp") == "yes":
        out += _entries(TMPFS, "/tmp", "/var/tmp", optional=False)
    if get("ProtectKernelTunables") == "yes":
        out += KERNEL_TUNABLES
    if get("ProtectKernelModules") == "yes":
        out += _entries(INACCESSIBLE, "/usr/lib/modules")
    if get("ProtectKernelLogs") == "yes":
        out += _entries(INACCESSIBLE, "/proc/kmsg", "/dev/kmsg")
    if get("ProtectControlGroups") == "yes":
        out += _entries(RO, "/sys/fs/cgroup")
    if get("PrivateDevices") == "yes":
        out.append(MountEntry("/dev", PRIVATE_DEV, False))
    if get("ProcSubset") == "pid":
        out.append(MountEntry("/proc", PROC_SUBSET_PID, False))
    return out


@dataclass(frozen=True, slots=True)
class Rule:
    action: int
    syscall: str
    args: tuple[tuple[int, int, int, int], ...] = ()  # (arg, op, datum_a, datum_b)


@dataclass(frozen=True, slots=True)
class SeccompFilter:
    default: int
    rules: tuple[Rule, ...]
    # Without SystemCallArchitectures=native systemd filters the secondary ABIs as well
    # (i386 and x32 on x86-64); with it, a call of another ABI is killed.
    other_abis: bool = True


def _deny(code: int, *syscalls: str) -> list[Rule]:
    return [Rule(scmp_errno(code), s) for s in syscalls]


def syscall_set(names: list[str]) -> set[str]:
    """Expand systemd's @groups (via `systemd-analyze syscall-filter`) into system calls."""
    out: set[str] = set()
    for name in names:
        if not name.startswith("@"):
            out.add(name)
            continue
        listing = subprocess.run(
            ["systemd-analyze", "syscall-filter", name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        items = [w for line in listing.splitlines()[1:] for w in line.split()[:1]]
        out |= syscall_set([w for w in items if not w.startswith("#")])
    return out


# System calls systemd allows whatever the filter says (systemd.exec(5), SystemCallFilter=).
IMPLICITLY_ALLOWED = ("execve", "exit", "exit_group", "getrlimit", "rt_sigreturn", "sigreturn")
ADDRESS_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
REALTIME_POLICIES = (1, 2, 6)  # SCHED_FIFO, SCHED_RR, SCHED_DEADLINE


def seccomp_filters(settings: dict[str, str], *, refuse_with_kill: bool) -> list[SeccompFilter]:
    """One filter per option, as systemd installs them (the kernel applies the strictest
    answer of all). `refuse_with_kill`: SystemCallFilter kills on a refused call instead of
    the unit's EPERM, so that a test cannot miss one."""
    get = settings.get
    out: list[SeccompFilter] = []
    if get("SystemCallArchitectures") == "native":
        out.append(SeccompFilter(SCMP_ACT_ALLOW, ()))
    if "RestrictAddressFamilies" in settings:
        allowed = {ADDRESS_FAMILIES[f] for f in settings["RestrictAddressFamilies"].split()}
        refused = scmp_errno(errno.EAFNOSUPPORT)
        rules = [
            Rule(refused, "socket", ((0, SCMP_CMP_EQ, family, 0),))
            for family in range(AF_MAX)
            if family not in allowed
        ]
        rules.append(Rule(refused, "socket", ((0, SCMP_CMP_GE, AF_MAX, 0),)))
        out.append(SeccompFilter(SCMP_ACT_ALLOW, tuple(rules)))
    if get("RestrictNamespaces") == "yes":
        rules = [*_deny(errno.EPERM, "setns"), Rule(scmp_errno(errno.ENOSYS), "clone3")]
        for flag in NAMESPACE_FLAGS:
            for call in ("unshare", "clone"):
                rules.append(
                    Rule(scmp_errno(errno.EPERM), call, ((0, SCMP_CMP_MASKED_EQ, flag, flag),))
                )
        out.append(SeccompFilter(SCMP_ACT_ALLOW, tuple(rules)))
    if get("LockPersonality") == "yes":
        rules = [Rule(scmp_errno(errno.EPERM), "personality", ((0, SCMP_CMP_NE, 0, 0),))]
        out.append(SeccompFilter(SCMP_ACT_ALLOW, tuple(rules)))
    if get("MemoryDenyWriteExecute") == "yes" and get("_mdwe") == "seccomp":
        wx, x = PROT_WRITE | PROT_EXEC, PROT_EXEC
        refused = scmp_errno(errno.EPERM)
        rules = [
            Rule(refused, "mmap", ((2, SCMP_CMP_MASKED_EQ, wx, wx),)),
            Rule(refused, "mprotect", ((2, SCMP_CMP_MASKED_EQ, x, x),)),
            Rule(refused, "pkey_mprotect", ((2, SCMP_CMP_MASKED_EQ, x, x),)),
            Rule(refused, "shmat", ((2, SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC),)),
        ]
        out.append(SeccompFilter(SCMP_ACT_ALLOW, tuple(rules)))
    if get("RestrictRealtime") == "yes":
        mask = 0xFFFFFFFF & ~SCHED_RESET_ON_FORK
        rules = [
            Rule(scmp_errno(errno.EPERM), "sched_setscheduler", ((1, SCMP_CMP_MASKED_EQ, mask, p),))
            for p in REALTIME_POLICIES
        ]
        rules += _deny(errno.EPERM, "sched_setattr")
        out.append(SeccompFilter(SCMP_ACT_ALLOW, tuple(rules)))
    if get("RestrictSUIDSGID") == "yes":
        rules = []
        for bit in (S_ISUID, S_ISGID):
            mode_arg = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2, "creat": 1}
            for call, arg in mode_arg.items():
                rules.append(
                    Rule(scmp_errno(errno.EPERM), call, ((arg, SCMP_CMP_MASKED_EQ, bit, bit),))
                )
            for call, flags_arg in (("open", 1), ("openat", 2)):
                cond = ((flags_arg, SCMP_CMP_MASKED_EQ, O_CREAT, O_CREAT),)
                cond += ((flags_arg + 1, SCMP_CMP_MASKED_EQ, bit, bit),)
                rules.append(Rule(scmp_errno(errno.EPERM), call, cond))
        out.append(SeccompFilter(SCMP_ACT_ALLOW, tuple(rules)))
    if get("ProtectKernelLogs") == "yes":
        out.append(SeccompFilter(SCMP_ACT_ALLOW, tuple(_deny(errno.EPERM, "syslog"))))
    if get("ProtectKernelModules") == "yes":
        calls = ("init_module", "finit_module", "delete_module")
        out.append(SeccompFilter(SCMP_ACT_ALLOW, tuple(_deny(errno.EPERM, *calls))))
    if get("ProtectHostname") == "yes":
        calls = ("sethostname", "setdomainname")
        out.append(SeccompFilter(SCMP_ACT_ALLOW, tuple(_deny(errno.EPERM, *calls))))
    # Last, as in systemd: loading a filter is itself a system call the allow-list refuses.
    if "SystemCallFilter" in settings:
        names = syscall_set(settings["SystemCallFilter"].split()) | set(IMPLICITLY_ALLOWED)
        refuse = (
            SCMP_ACT_KILL_PROCESS
            if refuse_with_kill
            else scmp_errno(getattr(errno, get("SystemCallErrorNumber", "EPERM")))
        )
        out.append(SeccompFilter(refuse, tuple(Rule(SCMP_ACT_ALLOW, n) for n in sorted(names))))
    native_only = get("SystemCallArchitectures") == "native"
    return [SeccompFilter(f.default, f.rules, not native_only) for f in out]


SCMP_ARCH_X86, SCMP_ARCH_X32 = 0x40000003, 0x4000003E


def load_seccomp(filt: SeccompFilter) -> None:
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    ctx = lib.seccomp_init(filt.default)
    # systemd loads filters with CAP_SYS_ADMIN rather than no_new_privs: NoNewPrivileges=
    # stays a separate option here too.
    lib.seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0)
    lib.seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS)
    if filt.other_abis:
        for arch in (SCMP_ARCH_X86, SCMP_ARCH_X32):
            lib.seccomp_arch_add(ctx, arch)
    for rule in filt.rules:
        nr = lib.seccomp_syscall_resolve_name(rule.syscall.encode())
        if nr < 0:
            continue  # not a system call of this architecture (systemd skips them too)
        args = (_ArgCmp * max(1, len(rule.args)))(*[_ArgCmp(*a) for a in rule.args])
        ret = lib.seccomp_rule_add_array(ctx, rule.action, nr, len(rule.args), args)
        if ret < 0:
            raise OSError(-ret, f"seccomp rule {rule}: {os.strerror(-ret)}")
    ret = lib.seccomp_load(ctx)
    if ret < 0:
        raise OSError(-ret, f"seccomp_load: {os.strerror(-ret)}")


def capability_numbers() -> dict[str, int]:
    listing = subprocess.run(
        ["systemd-analyze", "capability"], capture_output=True, text=True, check=True
    ).stdout
    return {
        f.split()[0].upper(): int(f.split()[1])
        for f in listing.splitlines()
        if f.startswith("cap_") and f.split()[1].isdigit()
    }


# ---------------------------------------------------------------------------------------
# Applying a sandbox in a child (`python -m tests.kernel.test_hardening sandbox SPEC -- CMD`).


def _mountinfo() -> list[tuple[str, set[str]]]:
    """(mount point, per-mount options) from /proc/self/mountinfo, in mount order."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        point = fields[4].encode().decode("unicode_escape")
        out.append((point, set(fields[5].split(","))))
    return out


def _under(path: str, top: str) -> bool:
    return top == "/" or path == top or path.startswith(top.rstrip("/") + "/")


def _remount(top: str, read_only: bool, keep_out: list[str]) -> None:
    """Set or clear read-only on every mount at or below `top`, skipping those below paths
    that have their own entry (systemd's deny list)."""
    for point, options in _mountinfo():
        if not _under(point, top) or any(_under(point, k) for k in keep_out):
            continue
        flags = MS_REMOUNT | MS_BIND | (MS_RDONLY if read_only else 0)
        flags |= sum(v for k, v in PER_MOUNT_FLAGS.items() if k in options)
        with contextlib.suppress(FileNotFoundError, PermissionError):  # a vanished mount
            _mount(None, point, None, flags)


def _private_dev(dev_fds: dict[str, int]) -> None:
    """A new /dev with the API pseudo devices only (PrivateDevices=yes)."""
    _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755")
    for name, fd in dev_fds.items():
        Path("/dev", name).touch()
        _mount(f"/proc/self/fd/{fd}", f"/dev/{name}", None, MS_BIND)
    for d in ("pts", "shm"):
        Path("/dev", d).mkdir()
    _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        Path("/dev", link).symlink_to(target)
    # Read-only, as systemd leaves it: nothing (nvidia-modprobe included) adds nodes later.
    _mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


def apply_mounts(entries: list[MountEntry], inaccessible_dir: Path, keep: list[str]) -> None:
    """keep: the checkout, which stands in for the installed program (/usr/local): where a
    private /tmp would hide it (a clone under /tmp), it is bound back in, as an installed
    program would stay visible."""
    _syscall_ok(_libc.unshare(CLONE_NEWNS), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    best: dict[str, MountEntry] = {}
    for e in entries:
        if e.path not in best or _MODE_RANK[e.mode] < _MODE_RANK[best[e.path].mode]:
            best[e.path] = e
    ordered = sorted(best.values(), key=lambda e: (e.path.rstrip("/").count("/"), e.path))
    ordered = [e for e in ordered if os.path.lexists(e.path) or not e.optional]
    # Inaccessible nodes (mode 0000, like /run/systemd/inaccessible/*) and the pseudo
    # devices are opened first: later mounts may hide where they came from.
    nodes = {
        kind: os.open(inaccessible_dir / kind, os.O_PATH)
        for kind in ("dir", "reg", "chr")
        if (inaccessible_dir / kind).exists()
    }
    dev_fds = {
        n: os.open(f"/dev/{n}", os.O_PATH) for n in ("null", "zero", "full", "random", "urandom")
    }
    kept = {path: os.open(path, os.O_PATH) for path in keep}
    mounted = {point for point, _ in _mountinfo()}
    for e in ordered:
        if e.mode == TMPFS:
            _mount("tmpfs", e.path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
            for path, fd in kept.items():
                if _under(path, e.path):
                    os.makedirs(path, exist_ok=True)
                    _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        elif e.mode == PRIVATE_DEV:
            _private_dev(dev_fds)
        elif e.mode == PROC_SUBSET_PID:
            _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "subset=pid")
        elif e.mode == INACCESSIBLE:
            mode = os.stat(e.path).st_mode
            kind = "dir" if stat.S_ISDIR(mode) else "chr" if stat.S_ISCHR(mode) else "reg"
            _mount(f"/proc/self/fd/{nodes[kind]}", e.path, None, MS_BIND)
            _mount(None, e.path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        elif e.mode in (RO, RW) and e.path not in mounted:
            _mount(e.path, e.path, None, MS_BIND | MS_REC)
    for e in ordered:
        if e.mode in (RO, RW):
            below = [o.path for o in ordered if o.path != e.path and _under(o.path, e.path)]
            _remount(e.path, e.mode == RO, below)


def apply_sandbox(spec: dict[str, Any]) -> None:
    """Everything systemd does between fork and execve, in its order: cgroup, namespaces and
    mounts, limits, umask, capability bounding set, no_new_privs, MDWE, seccomp."""
    settings: dict[str, str] = spec["settings"]
    numbers = capability_numbers()  # read while /proc/sys is still there (ProcSubset=)
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for procs in spec.get("cgroups", []):
        Path(procs).write_text(str(os.getpid()))
    if "OOMScoreAdjust" in settings:
        Path("/proc/self/oom_score_adj").write_text(settings["OOMScoreAdjust"])
    entries = mount_entries(settings)
    if entries:
        apply_mounts(entries, Path(spec["inaccessible"]), spec.get("keep", []))
    if settings.get("ProtectHostname") == "yes":
        _syscall_ok(_libc.unshare(CLONE_NEWUTS), "unshare uts")
    if settings.get("PrivateUsers") == "yes":
        _syscall_ok(_libc.unshare(CLONE_NEWUSER), "unshare user")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text("0 0 1")
        Path("/proc/self/gid_map").write_text("0 0 1")
    for key, limit in (
        ("LimitMEMLOCK", resource.RLIMIT_MEMLOCK),
        ("LimitNOFILE", resource.RLIMIT_NOFILE),
        ("LimitNICE", resource.RLIMIT_NICE),
    ):
        if key in settings:
            want = resource.RLIM_INFINITY if settings[key] == "infinity" else int(settings[key])
            hard = resource.getrlimit(limit)[1]
            if hard != resource.RLIM_INFINITY and (want == resource.RLIM_INFINITY or want > hard):
                want = hard  # raising a hard limit needs CAP_SYS_RESOURCE, which may be absent
            resource.setrlimit(limit, (want, want))
    if "UMask" in settings:
        os.umask(int(settings["UMask"], 8))
    keep = set(range(last + 1))
    if "CapabilityBoundingSet" in settings:
        keep = {numbers[c] for c in settings["CapabilityBoundingSet"].split()}
    if settings.get("PrivateDevices") == "yes":
        keep -= {numbers["CAP_MKNOD"], numbers["CAP_SYS_RAWIO"]}
    for cap in range(last + 1):
        if cap not in keep:
            _prctl(PR_CAPBSET_DROP, cap)
    if settings.get("NoNewPrivileges") == "yes":
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
    if settings.get("MemoryDenyWriteExecute") == "yes" and settings.get("_mdwe") == "prctl":
        _prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN)
    for filt in seccomp_filters(settings, refuse_with_kill=spec.get("kill", True)):
        load_seccomp(filt)


# ---------------------------------------------------------------------------------------
# The load run inside the sandbox (`python -m tests.kernel.test_hardening load ...`).

HOOKS_BPF = b"""
BPF_RINGBUF_OUTPUT(hits, 16);
BPF_ARRAY(counts, u64, 3);
static void count(int i) { u64 *c = counts.lookup(&i); if (c) __sync_fetch_and_add(c, 1); }
int on_malloc(struct pt_regs *ctx) {
    u32 one = 1;
    count(0);
    hits.ringbuf_output(&one, sizeof(one), 0);
    return 0;
}
int on_fault(struct bpf_perf_event_data *ctx) { count(1); return 0; }
TRACEPOINT_PROBE(sched, sched_switch) { count(2); return 0; }
"""


def load_hooks(other_pid: int) -> dict[str, Any]:
    """The kernel facilities later probes use, through bcc: a uprobe on another user's
    process (libcuda and allocator probes), a per-CPU software perf event (fault counters), a
    tracepoint, a ring buffer drained by a ctypes callback (libffi closures)."""
    from bcc import BPF, PerfSWConfig, PerfType

    out: dict[str, Any] = {}
    try:
        b = BPF(text=HOOKS_BPF)
    except Exception as exc:
        return {"compile": f"error: {str(exc).splitlines()[-1]}"}
    attach: dict[str, Callable[[], Any]] = {
        "uprobe": lambda: b.attach_uprobe(
            name="c", sym="malloc", fn_name="on_malloc", pid=other_pid
        ),
        "perf_event": lambda: b.attach_perf_event(
            ev_type=PerfType.SOFTWARE,
            ev_config=PerfSWConfig.PAGE_FAULTS_MIN,
            fn_name="on_fault",
            sample_period=1,
        ),
    }
    for name, fn in attach.items():
        try:
            fn()
        except Exception as exc:
            out[name] = f"error: {str(exc).splitlines()[-1]}"
    delivered = [0]

    def on_hit(_ctx: Any, _data: Any, _size: int) -> int:
        delivered[0] += 1
        return 0

    try:
        b["hits"].open_ring_buffer(on_hit)
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            b.ring_buffer_poll(100)
        if "uprobe" not in out:  # stop the source, then drain: every record must arrive
            b.detach_uprobe(name="c", sym="malloc", pid=other_pid)
        b.ring_buffer_consume()
    except Exception as exc:
        out["ring_buffer"] = f"error: {str(exc).splitlines()[-1]}"
    counts = [int(v.value) for v in b["counts"].values()]
    for i, name in enumerate(("uprobe", "perf_event", "tracepoint")):
        out.setdefault(name, counts[i])
    out.setdefault("ring_buffer", delivered[0])
    b.cleanup()
    return out


def load_plumbing(other_pid: int, group: str, notify: str) -> dict[str, Any]:
    """The daemon's sinks at the configuration's default paths (the unit's directories)."""
    from gpujitter.daemon.service.config import load_config
    from gpujitter.daemon.service.sdnotify import Notifier
    from gpujitter.daemon.sinks.metrics import DaemonMetrics
    from gpujitter.daemon.sinks.stream import StreamServer

    cfg = load_config(EXAMPLE_CONFIG, environ={})
    out: dict[str, Any] = {}

    def attempt(name: str, fn: Callable[[], Any]) -> None:
        try:
            out[name] = fn()
        except Exception as exc:
            out[name] = f"error: {exc}"

    def stream() -> dict[str, Any]:
        server = StreamServer(
            Path(cfg["socket.path"]),
            hello=lambda: {"pid": os.getpid()},
            snapshot=lambda: [],
            mode=cfg["socket.mode"],
            group=group,
        ).start()
        try:
            st = os.stat(cfg["socket.path"])
            with socket.socket(socket.AF_UNIX) as client:
                client.settimeout(10)
                client.connect(cfg["socket.path"])
                hello = json.loads(client.makefile().readline())
            return {
                "mode": oct(st.st_mode & 0o777),
                "group": grp.getgrgid(st.st_gid).gr_name,
                "hello": hello["type"],
            }
        finally:
            server.close()

    def metrics() -> bool:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        DaemonMetrics().serve(f"localhost:{port}")
        body = urllib.request.urlopen(f"http://localhost:{port}/metrics", timeout=10).read()
        return b"gpujitter_stream_clients" in body

    def log_file() -> str:
        path = Path(cfg["log.path"]).with_name(f"hardening-{os.getpid()}.jsonl")
        with path.open("a") as f:
            f.write("{}\n")
        mode = oct(path.stat().st_mode & 0o777)
        path.unlink()
        return mode

    def state_file() -> bool:
        path = Path("/var/lib/gpujitter", f"hardening-{os.getpid()}")
        path.write_text("x")
        path.unlink()
        return True

    attempt("stream", stream)
    attempt("metrics", metrics)
    attempt("notify", lambda: Notifier({"NOTIFY_SOCKET": notify}).ready("hardening test"))
    attempt("log_file", log_file)
    attempt("state_file", state_file)
    attempt("maps", lambda: len(Path(f"/proc/{other_pid}/maps").read_text()) > 0)
    attempt("environ", lambda: len(Path(f"/proc/{other_pid}/environ").read_bytes()) > 0)
    attempt("exe", lambda: os.readlink(f"/proc/{other_pid}/exe"))
    return out


# Controls: small programs, each in its own process so that a refused call cannot take the
# load with it; "ok", the errno name of the refusal, or the signal that killed it.
_CONTROL_PRELUDE = """
import ctypes, errno, mmap, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def check(ret):
    if ret == -1:
        raise OSError(ctypes.get_errno(), errno.errorcode[ctypes.get_errno()])
"""
CONTROLS = {
    "mmap_wx": "mmap.mmap(-1, 4096, prot=7)",
    "af_packet": "socket.socket(socket.AF_PACKET, socket.SOCK_RAW)",
    "af_netlink": "socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)",
    "unshare_uts": "check(libc.unshare(0x04000000))",
    "personality": "check(libc.personality(0x0008))",  # PER_LINUX32
    "realtime": "os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))",
    "setuid_bit": "import tempfile\nf = tempfile.mkstemp()[1]\ntry: os.chmod(f, 0o4755)\n"
    "finally: os.unlink(f)",
    "syslog": "check(libc.klogctl(10, None, 0))",  # SYSLOG_ACTION_SIZE_BUFFER
    "swapoff": "check(libc.swapoff(b'/nonexistent-gpujitter-swap'))",
    "kallsyms": "assert open('/proc/kallsyms').read(), errno.errorcode[errno.ENODATA]",
    "kmsg": "open('/dev/kmsg', 'rb').close()",
    # i386 getpid through int 0x80 (the 32-bit ABI of a 64-bit kernel), from a file mapped
    # executable and never writable, which MemoryDenyWriteExecute allows.
    "i386_syscall": "import tempfile\nf = tempfile.TemporaryFile()\n"
    "f.write(b'\\xb8\\x14\\0\\0\\0\\xcd\\x80\\xc3'.ljust(4096, b'\\0')); f.flush()\n"
    "libc.mmap.restype = ctypes.c_void_p\n"
    "libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]"
    "\ncode = libc.mmap(None, 4096, 5, 2, f.fileno(), 0)\n"  # PROT_READ|PROT_EXEC, MAP_PRIVATE
    "assert ctypes.CFUNCTYPE(ctypes.c_int)(code)() == os.getpid()",
}


def run_control(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", f"{_CONTROL_PRELUDE}\n{code}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode < 0:
        return f"killed by {signal.Signals(-done.returncode).name}"
    if done.returncode == 0:
        return "ok"
    last = (done.stderr.strip().splitlines() or ["?"])[-1]
    names = [n for n in errno.errorcode.values() if n in last.replace(":", " ").split()]
    names += [errno.errorcode[c] for c in errno.errorcode if os.strerror(c) in last]
    return names[0] if names else last


def facts() -> dict[str, Any]:
    """What the process can see of its own confinement."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    writable = {}
    for path in (
        "/",
        "/usr",
        "/etc",
        "/etc/gpujitter",
        "/var/lib/gpujitter",
        "/var/log/gpujitter",
        "/run/gpujitter",
        "/run",
        "/tmp",
        "/var/tmp",
        "/home",
        "/root",
        "/proc/sys",
        "/sys",
        "/sys/kernel/tracing",
        "/sys/fs/cgroup",
        "/dev",
        "/proc/irq",
    ):
        with contextlib.suppress(FileNotFoundError):
            writable[path] = not os.statvfs(path).f_flag & os.ST_RDONLY
    modules = Path("/usr/lib/modules")
    return {
        "cap_eff": int(status["CapEff"], 16),
        "cap_bnd": int(status["CapBnd"], 16),
        "no_new_privs": status["NoNewPrivs"].strip(),
        "seccomp_filters": int(status.get("Seccomp_filters", "0")),
        "writable": writable,
        "modules_listable": os.access(modules, os.R_OK | os.X_OK) and bool(list(modules.iterdir())),
        "uts_ns": os.readlink("/proc/self/ns/uts"),
        "mnt_ns": os.readlink("/proc/self/ns/mnt"),
        "umask": oct(_current_umask()),
        "memlock": resource.getrlimit(resource.RLIMIT_MEMLOCK)[0],
        "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        "nice_limit": resource.getrlimit(resource.RLIMIT_NICE)[0],
        "oom_score_adj": int(Path("/proc/self/oom_score_adj").read_text()),
        "mdwe": _libc.prctl(PR_GET_MDWE, 0, 0, 0, 0),
        "tmp_marker": Path(os.environ.get("GJ_TMP_MARKER", "/nonexistent")).exists(),
        # Node-wide files the IRQ, swap and audit code read.
        "proc_files": {p: os.path.exists(p) for p in NODE_WIDE_PROC_FILES},
        "cgroup": Path("/proc/self/cgroup").read_text(),
        "controls": {name: run_control(code) for name, code in CONTROLS.items()},
    }


def load_nvml() -> dict[str, Any]:
    """What the GPU side reads from NVML, called directly so that every refusal shows (the
    daemon's own NVML module turns errors into missing readings)."""
    import pynvml

    out: dict[str, Any] = {}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return {"init": str(err)}
    out["gpus"] = pynvml.nvmlDeviceGetCount()
    calls: dict[str, Callable[[Any], Any]] = {
        "name": pynvml.nvmlDeviceGetName,
        "utilization": lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
        "power_samples": lambda h: len(
            pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_TOTAL_POWER_SAMPLES, 0)[1]
        ),
        "processes": lambda h: len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
        "pci": lambda h: pynvml.nvmlDeviceGetPciInfo(h).busId,
    }
    for i in range(out["gpus"]):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        for name, fn in calls.items():
            try:
                value = fn(handle)
                out[f"{i}.{name}"] = value.decode() if isinstance(value, bytes) else value
            except pynvml.NVMLError as err:
                out[f"{i}.{name}"] = f"error: {err}"
    pynvml.nvmlShutdown()
    return out


NODE_WIDE_PROC_FILES = ("/proc/interrupts", "/proc/softirqs", "/proc/vmstat", "/proc/irq")


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def probe_names() -> list[str]:
    """One probe per kind of kernel hook (raw tracepoints reading a task's registers through
    its BTF pointer, raw tracepoints, perf events): what a sandbox option can break is the
    hook kind, and compiling every probe for each of the ~30 options would cost minutes.
    Uprobes, ring buffers and ctypes callbacks are exercised by load_hooks."""
    from gpujitter.probes import registry

    light = ["malloc", "irq", "faults"]
    assert all(name in registry.specs() for name in light)
    return light


def run_load(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    probe = None
    if "probe" in args.parts:
        gpujitter = Path(sys.executable).with_name("gpujitter")
        cmd = [str(gpujitter), "probe", *probe_names(), "--duration", args.duration, "--json"]
        probe = subprocess.Popen(
            [*cmd, "--quiet", "-t", "malloc.syscall=0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    if "hooks" in args.parts:
        out["hooks"] = load_hooks(args.other_pid)
    if "plumbing" in args.parts:
        out["plumbing"] = load_plumbing(args.other_pid, args.group, args.notify)
    if "nvml" in args.parts:
        out["nvml"] = load_nvml()
    if "facts" in args.parts:
        out["facts"] = facts()
    if probe is not None:
        stdout, stderr = probe.communicate(timeout=300)
        # bcc prints some diagnostics on stdout: the summary is the last JSON line.
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        summary = json.loads(lines[-1]) if lines else {}
        out["probe"] = {
            "rc": probe.returncode,
            "error": stderr.strip().splitlines()[-1] if probe.returncode else "",
            "states": {n: s["state"] for n, s in summary.get("probes", {}).items()},
            "events": sum(summary.get("events", {}).values()),
            "lost": {
                n: s["lost_kernel"] + s["lost_user"] for n, s in summary.get("probes", {}).items()
            },
        }
    return out


# ---------------------------------------------------------------------------------------
# The tests.

pytestmark = pytest.mark.kernel

UNIT_DIRECTORIES = {
    "ConfigurationDirectory": ("/etc", "0755"),
    "StateDirectory": ("/var/lib", "StateDirectoryMode"),
    "LogsDirectory": ("/var/log", "LogsDirectoryMode"),
    "RuntimeDirectory": ("/run", "RuntimeDirectoryMode"),
}


def unit_settings() -> dict[str, str]:
    from tests.unit.test_systemd import read_unit

    return {key: " ".join(values) for key, values in read_unit(UNIT)["Service"].items()}


def _writable(r: dict[str, Any], path: str) -> bool:
    return bool(r["facts"]["writable"][path])


def _control(r: dict[str, Any], name: str) -> str:
    return str(r["facts"]["controls"][name])


# Every sandbox and resource option of the unit, with the control that shows it in force.
SANDBOX: dict[str, Callable[[dict[str, Any]], bool]] = {
    "CapabilityBoundingSet": lambda r: r["facts"]["cap_bnd"] == r["expected_caps"],
    "NoNewPrivileges": lambda r: r["facts"]["no_new_privs"] == "1",
    "ProtectSystem": lambda r: (
        not _writable(r, "/usr")
        and not _writable(r, "/etc/gpujitter")
        and all(
            _writable(r, p) for p in ("/var/lib/gpujitter", "/var/log/gpujitter", "/run/gpujitter")
        )
    ),
    "ProtectHome": lambda r: not _writable(r, "/home") and not _writable(r, "/root"),
    "PrivateTmp": lambda r: not r["facts"]["tmp_marker"] and _writable(r, "/tmp"),
    "ProtectKernelTunables": lambda r: (
        not _writable(r, "/proc/sys")
        and not _writable(r, "/sys/kernel/tracing")
        and _control(r, "kallsyms") == "ENODATA"
    ),
    # syslog(2): EPERM from this option's filter, or SIGSYS when the allow-list answers first.
    "ProtectKernelLogs": lambda r: (
        _control(r, "kmsg") in ("ENXIO", "EACCES")
        and _control(r, "syslog") in ("EPERM", "killed by SIGSYS")
    ),
    "ProtectControlGroups": lambda r: not _writable(r, "/sys/fs/cgroup"),
    "ProtectHostname": lambda r: r["facts"]["uts_ns"] != os.readlink("/proc/self/ns/uts"),
    "RestrictNamespaces": lambda r: _control(r, "unshare_uts") == "EPERM",
    "LockPersonality": lambda r: _control(r, "personality") == "EPERM",
    "MemoryDenyWriteExecute": lambda r: _control(r, "mmap_wx") in ("EPERM", "EACCES"),
    "RestrictRealtime": lambda r: _control(r, "realtime") == "EPERM",
    "RestrictSUIDSGID": lambda r: _control(r, "setuid_bit") == "EPERM",
    "RestrictAddressFamilies": lambda r: (
        _control(r, "af_packet") == _control(r, "af_netlink") == "EAFNOSUPPORT"
    ),
    "SystemCallArchitectures": lambda r: _control(r, "i386_syscall") == "killed by SIGSYS",
    "SystemCallFilter": lambda r: _control(r, "swapoff") == "killed by SIGSYS",
    "SystemCallErrorNumber": lambda r: _control(r, "swapoff") == "EPERM",
    "UMask": lambda r: r["plumbing"]["log_file"] == "0o640",
    "LimitMEMLOCK": lambda r: r["facts"]["memlock"] == r["expected_limits"]["LimitMEMLOCK"],
    "LimitNOFILE": lambda r: r["facts"]["nofile"] == r["expected_limits"]["LimitNOFILE"],
    "LimitNICE": lambda r: r["facts"]["nice_limit"] == r["expected_limits"]["LimitNICE"],
    "OOMScoreAdjust": lambda r: r["facts"]["oom_score_adj"] == 500,
    # Run inside the memory cgroup, and never reached its limit.
    "MemoryHigh": lambda r: (
        r["cgroup"]["name"] in r["facts"]["cgroup"] and r["cgroup"]["memory_limit_hits"] == 0
    ),
    "MemoryMax": lambda r: (
        r["cgroup"]["name"] in r["facts"]["cgroup"] and r["cgroup"]["memory_limit_hits"] == 0
    ),
    "CPUQuota": lambda r: r["cgroup"]["cpu_quota_us"] > 0,
    "CPUQuotaPeriodSec": lambda r: r["cgroup"]["cpu_period_us"] == 10_000,
    # systemd's own mapping on v1: weight * 1024 / 100 shares
    "CPUWeight": lambda r: r["cgroup"]["cpu_weight_set"] in ("10", "102"),
    "TasksMax": lambda r: r["cgroup"]["pids_max"] == 64,
}
# Options run together: one means nothing without the other, or both are one resource.
GROUPS = (
    ("ProtectSystem", "PrivateTmp"),  # see test_protect_system_needs_private_tmp
    ("MemoryHigh", "MemoryMax"),
    ("CPUQuota", "CPUQuotaPeriodSec", "CPUWeight"),
    ("LimitMEMLOCK", "LimitNOFILE", "LimitNICE"),
    ("SystemCallFilter", "SystemCallErrorNumber"),
)
# This container withholds CAP_SYS_RESOURCE, so hard limits cannot be raised to the unit's
# values: the limits are applied as far as they go, and a control cannot tell them from no
# limit at all. test_bpf_maps_do_not_need_locked_memory_here shows why that does not matter.
CANNOT_RAISE_HERE = {"LimitMEMLOCK", "LimitNOFILE", "LimitNICE"}
# [Service] keys that are not sandbox or resource options; test_systemd.py covers them.
NOT_SANDBOX = {
    "Type",
    "NotifyAccess",
    "ExecStart",
    "ExecReload",
    "EnvironmentFile",
    "Environment",  # GPUJITTER_DEBUG=1 (test_systemd)
    "TimeoutStartSec",
    "TimeoutStopSec",
    "WatchdogSec",
    "Restart",
    "RestartSec",
    "RestartPreventExitStatus",
    "SuccessExitStatus",
    *UNIT_DIRECTORIES,
    "StateDirectoryMode",
    "LogsDirectoryMode",
    "RuntimeDirectoryMode",
}


@dataclass
class Env:
    other_pid: int
    group: str
    notify: socket.socket
    notify_address: str
    inaccessible: Path
    tmp_marker: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    settings = unit_settings()
    made: list[Path] = []
    inaccessible = tmp_path_factory.mktemp("inaccessible")
    (inaccessible / "reg").touch(mode=0)
    (inaccessible / "dir").mkdir(mode=0)
    os.mknod(inaccessible / "chr", 0 | stat.S_IFCHR, os.makedev(0, 0))
    marker = Path(tempfile.mkstemp(prefix="gpujitter-hardening-", dir="/tmp")[1])
    # Another user's process that keeps allocating: target of uprobes and /proc reads.
    nobody = pwd.getpwnam("nobody")
    other = subprocess.Popen(
        [sys.executable, "-c", ALLOCATING_LOOP],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        env={"GPUJITTER_HARDENING": "1"},
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    address = f"@gpujitter-hardening-{os.getpid()}"
    notify.bind("\0" + address[1:])
    notify.settimeout(0)
    try:
        for key, (root, mode_key) in UNIT_DIRECTORIES.items():
            path = Path(root, settings[key])
            if not path.exists():
                path.mkdir(mode=int(settings.get(mode_key, mode_key), 8))
                made.append(path)
        time.sleep(0.3)  # the allocating loop maps libc before uprobes resolve it
        yield Env(
            other.pid, grp.getgrgid(nobody.pw_gid).gr_name, notify, address, inaccessible, marker
        )
    finally:
        other.kill()
        other.wait()
        notify.close()
        marker.unlink()
        for path in reversed(made):
            with contextlib.suppress(OSError):
                for leftover in path.iterdir():
                    leftover.unlink()
                path.rmdir()


ALLOCATING_LOOP = """
import time
while True:
    blocks = [bytearray(1000) for _ in range(100)]
    time.sleep(0.01)
"""


@contextlib.contextmanager
def resource_cgroups(settings: dict[str, str]) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """The unit's resource controls as cgroups (v1 controllers here, or v2): yields the
    cgroup.procs files the child joins, then fills in what the cgroups saw."""
    name = f"gpujitter-hardening-{os.getpid()}"
    stats: dict[str, Any] = {"name": name, "memory_limit_hits": 0, "pids_max": 0}
    stats.update(cpu_quota_us=0, cpu_period_us=0, cpu_weight_set="")
    memory = [parse_size(settings[k]) for k in ("MemoryHigh", "MemoryMax") if k in settings]
    period_us = int(seconds(settings.get("CPUQuotaPeriodSec", "100ms")) * 1e6)
    quota_us = (
        int(period_us * int(settings["CPUQuota"].rstrip("%")) / 100)
        if "CPUQuota" in settings
        else 0
    )
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    dirs: list[Path] = []
    writes: list[tuple[str, str, str]] = []  # (controller, file, value)
    if memory:
        # v1 has no memory.high: the lower of the two becomes a hard limit (stricter).
        writes.append(("memory", "memory.max" if v2 else "memory.limit_in_bytes", str(min(memory))))
    if quota_us:
        if v2:
            writes.append(("cpu", "cpu.max", f"{quota_us} {period_us}"))
        else:
            writes += [
                ("cpu", "cpu.cfs_period_us", str(period_us)),
                ("cpu", "cpu.cfs_quota_us", str(quota_us)),
            ]
        stats.update(cpu_quota_us=quota_us, cpu_period_us=period_us)
    if "CPUWeight" in settings:
        weight = int(settings["CPUWeight"])
        writes.append(("cpu", "cpu.weight", str(weight)) if v2 else
                      ("cpu", "cpu.shares", str(weight * 1024 // 100)))  # fmt: skip
    if "TasksMax" in settings:
        writes.append(("pids", "pids.max", settings["TasksMax"]))
        stats["pids_max"] = int(settings["TasksMax"])
    for controller in dict.fromkeys(c for c, _, _ in writes):
        d = Path("/sys/fs/cgroup", "" if v2 else controller, name)
        d.mkdir()
        dirs.append(d)
    try:
        for controller, file, value in writes:
            Path("/sys/fs/cgroup", "" if v2 else controller, name, file).write_text(value)
        yield [str(d / "cgroup.procs") for d in dirs], stats
        cpu = Path("/sys/fs/cgroup", "" if v2 else "cpu", name)
        for file in ("cpu.weight", "cpu.shares") if "CPUWeight" in settings else ():
            if (cpu / file).exists():  # what the kernel kept while the load ran
                stats["cpu_weight_set"] = (cpu / file).read_text().strip()
                break
        for d in dirs:
            if v2 and (d / "memory.events").exists():
                events = dict(
                    line.split() for line in (d / "memory.events").read_text().splitlines()
                )
                stats["memory_limit_hits"] = int(events["max"]) + int(events["high"])
            elif (d / "memory.failcnt").exists():
                stats["memory_limit_hits"] = int((d / "memory.failcnt").read_text())
                stats["memory_peak_bytes"] = int((d / "memory.max_usage_in_bytes").read_text())
    finally:
        for d in dirs:
            with contextlib.suppress(OSError):
                d.rmdir()


def parse_size(value: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(value[:-1]) * units[value[-1]] if value[-1] in units else int(value)


def seconds(value: str) -> float:
    from tests.unit.test_systemd import seconds as unit_seconds

    return unit_seconds(value)


def expected_caps(settings: dict[str, str]) -> int:
    numbers = capability_numbers()
    if "CapabilityBoundingSet" not in settings:
        return -1
    return sum(1 << numbers[c] for c in settings["CapabilityBoundingSet"].split())


def expected_limits(settings: dict[str, str]) -> dict[str, int]:
    out = {}
    for key, limit in (
        ("LimitMEMLOCK", resource.RLIMIT_MEMLOCK),
        ("LimitNOFILE", resource.RLIMIT_NOFILE),
        ("LimitNICE", resource.RLIMIT_NICE),
    ):
        want = (
            resource.RLIM_INFINITY
            if settings.get(key) == "infinity"
            else int(settings.get(key, -1))
        )
        hard = resource.getrlimit(limit)[1]
        out[key] = hard if hard != resource.RLIM_INFINITY and (want < 0 or want > hard) else want
    return out


def run_sandboxed(
    env: Env,
    settings: dict[str, str],
    *,
    parts: str = "probe,hooks,plumbing,facts",
    kill: bool = True,
    mdwe: str = "seccomp",
) -> dict[str, Any]:
    """Run the load under `settings` (unit keys -> values) and return what it saw."""
    everything = unit_settings()
    settings = {**{k: everything[k] for k in UNIT_DIRECTORIES}, **settings, "_mdwe": mdwe}
    with resource_cgroups(settings) as (cgroups, cgroup_stats):
        spec = {
            "settings": settings,
            "inaccessible": str(env.inaccessible),
            "keep": [str(REPO)],
            "kill": kill,
            "cgroups": cgroups,
        }
        load = [sys.executable, "-m", "tests.kernel.test_hardening", "load", "--parts", parts]
        load += [
            "--other-pid",
            str(env.other_pid),
            "--group",
            env.group,
            "--notify",
            env.notify_address,
        ]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.kernel.test_hardening",
                "sandbox",
                json.dumps(spec),
                "--",
                *load,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "GJ_TMP_MARKER": str(env.tmp_marker)},
        )
    assert done.returncode == 0, f"sandboxed load failed ({done.returncode}): {done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(done.stdout)
    result["cgroup"] = cgroup_stats
    result["expected_caps"] = expected_caps(settings)
    result["expected_limits"] = expected_limits(settings)
    notes = []
    with contextlib.suppress(BlockingIOError):
        while True:
            notes.append(env.notify.recv(4096).decode())
    result["notified"] = notes
    return result


@pytest.fixture(scope="module")
def baseline(env: Env) -> dict[str, Any]:
    """The load without any sandbox: what every option must leave as it is."""
    r = run_sandboxed(env, {})
    assert r["probe"]["rc"] == 0 and probe_ran(r["probe"]["states"]), r["probe"]
    assert_load_works(r, r)
    return r


def probe_ran(states: dict[str, str]) -> bool:
    """A probe, not only the core module (CORE_PROBE, running with any set), ran."""
    return any(state == "running" for name, state in states.items() if name != CORE_PROBE)


def assert_load_works(r: dict[str, Any], baseline: dict[str, Any]) -> None:
    """Probes in the same states as without a sandbox, delivering and losing nothing; every
    bcc hook firing; every piece of the daemon's plumbing working."""
    probe = r["probe"]
    assert (probe["rc"], probe["error"]) == (0, ""), probe
    assert probe["states"] == baseline["probe"]["states"]
    assert probe["events"] > 0
    assert set(probe["lost"].values()) == {0}
    hooks = r["hooks"]
    assert all(isinstance(v, int) and v > 0 for v in hooks.values()), hooks
    assert hooks["ring_buffer"] == hooks["uprobe"]  # every record reached the ctypes callback
    plumbing = r["plumbing"]
    assert plumbing["stream"] == baseline["plumbing"]["stream"], plumbing
    assert plumbing["metrics"] is True and plumbing["notify"] is True, plumbing
    assert plumbing["state_file"] is True and plumbing["maps"] is True, plumbing
    assert plumbing["environ"] is True, plumbing
    assert plumbing["exe"] == os.path.realpath(sys.executable), plumbing
    assert any(n.startswith("READY=1") for n in r["notified"]), r["notified"]


def sandbox_groups() -> list[tuple[str, ...]]:
    in_unit = [k for k in SANDBOX if k in unit_settings()]
    grouped = {k for g in GROUPS for k in g}
    return [(k,) for k in in_unit if k not in grouped] + [
        g for g in GROUPS if all(k in in_unit for k in g)
    ]


@pytest.mark.matrix
@pytest.mark.parametrize("keys", sandbox_groups(), ids="+".join)
def test_option_leaves_probes_hooks_and_plumbing_working(
    keys: tuple[str, ...], env: Env, baseline: dict[str, Any]
) -> None:
    everything = unit_settings()
    r = run_sandboxed(
        env, {k: everything[k] for k in keys}, kill="SystemCallErrorNumber" not in keys
    )
    assert_load_works(r, baseline)
    for key in keys:
        if key == "SystemCallFilter" and "SystemCallErrorNumber" in keys:
            continue  # refused calls get EPERM in this run: SystemCallErrorNumber's control
        assert SANDBOX[key](r), f"{key} is not in force: {json.dumps(r['facts'])[:3000]}"
        # ... and the control would have told: without the option it does not hold.
        assert key in CANNOT_RAISE_HERE or not SANDBOX[key](baseline), key


@pytest.mark.parametrize("mdwe", ["seccomp", "prctl"])
def test_whole_unit_at_once(mdwe: str, env: Env, baseline: dict[str, Any]) -> None:
    """Every option together, MemoryDenyWriteExecute both ways systemd implements it (seccomp
    before v254, prctl(PR_SET_MDWE) from v254 on kernels >= 6.3)."""
    r = run_sandboxed(env, {k: v for k, v in unit_settings().items() if k in SANDBOX}, mdwe=mdwe)
    assert_load_works(r, baseline)
    # Refused calls kill here, so the EPERM of SystemCallErrorNumber cannot show.
    missing = [
        k
        for k in SANDBOX
        if k in unit_settings() and k != "SystemCallErrorNumber" and not SANDBOX[k](r)
    ]
    assert not missing, missing
    assert r["facts"]["mdwe"] == (PR_MDWE_REFUSE_EXEC_GAIN if mdwe == "prctl" else 0)
    print(f"memory peak under the whole unit: {r['cgroup'].get('memory_peak_bytes', 0) >> 20} MiB")


def test_protect_system_alone_leaves_the_probes_running(env: Env) -> None:
    """ProtectSystem=strict alone makes /tmp read-only. The probe loader captured the
    compiler's messages through a temporary file, and every start failed without
    PrivateTmp=yes; it captures them in memory (a memfd) now, so a drop-in that turns
    PrivateTmp off (to share /tmp with the job) costs nothing."""
    everything = unit_settings()
    r = run_sandboxed(env, {"ProtectSystem": everything["ProtectSystem"]}, parts="probe")
    assert r["probe"]["rc"] == 0 and probe_ran(r["probe"]["states"]), r["probe"]


def whole_unit(**change: str) -> dict[str, str]:
    return {**{k: v for k, v in unit_settings().items() if k in SANDBOX}, **change}


def _failed(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("error")


# What stops working when one capability leaves the unit's bounding set. The kernel lets
# CAP_SYS_ADMIN stand in for CAP_BPF and CAP_PERFMON: those two are shown needed once
# CAP_SYS_ADMIN is gone too (the unit without uprobes, docs/operations.md).
CAPABILITY_NEEDED_FOR: dict[str, tuple[str, Callable[[dict[str, Any]], bool]]] = {
    # Loading tracing programs needs both: bcc refuses to compile without either.
    "CAP_BPF": ("probe,hooks", lambda r: r["probe"]["rc"] != 0 and _failed(r["hooks"]["compile"])),
    "CAP_PERFMON": (
        "probe,hooks",
        lambda r: r["probe"]["rc"] != 0 and _failed(r["hooks"]["compile"]),
    ),
    # The uprobe PMU wants CAP_SYS_ADMIN (tracefs, bcc's fallback, is read-only here).
    "CAP_SYS_ADMIN": ("hooks", lambda r: _failed(r["hooks"]["uprobe"])),
    # /proc/PID/exe and /proc/PID/root (how bcc finds a process's libraries).
    "CAP_SYS_PTRACE": (
        "hooks,plumbing",
        lambda r: _failed(r["hooks"]["uprobe"]) and _failed(r["plumbing"]["exe"]),
    ),
    "CAP_DAC_READ_SEARCH": ("plumbing", lambda r: _failed(r["plumbing"]["environ"])),
    "CAP_CHOWN": ("plumbing", lambda r: _failed(r["plumbing"]["stream"])),
}


@pytest.mark.parametrize("cap", sorted(CAPABILITY_NEEDED_FOR))
def test_each_capability_is_needed(cap: str, env: Env) -> None:
    """The bounding set holds nothing more than the probes and the daemon need: without any
    one of them, the feature that needs it fails (and the whole set suffices, above)."""
    kept = unit_settings()["CapabilityBoundingSet"].split()
    assert cap in kept
    parts, broken = CAPABILITY_NEEDED_FOR[cap]
    dropped = {cap, "CAP_SYS_ADMIN"} if cap in ("CAP_BPF", "CAP_PERFMON") else {cap}
    without = " ".join(c for c in kept if c not in dropped)
    r = run_sandboxed(env, whole_unit(CapabilityBoundingSet=without), parts=parts)
    assert broken(r), json.dumps({k: r.get(k) for k in ("probe", "hooks", "plumbing")})


def test_every_capability_of_the_unit_is_accounted_for() -> None:
    assert set(unit_settings()["CapabilityBoundingSet"].split()) == set(CAPABILITY_NEEDED_FOR)


def test_protect_kernel_modules_hides_the_headers_bcc_compiles_with(env: Env) -> None:
    r = run_sandboxed(env, {"ProtectKernelModules": "yes"}, parts="probe,facts")
    assert r["probe"]["rc"] != 0
    assert not r["facts"]["modules_listable"]


def test_private_users_leaves_bpf_without_capabilities(env: Env) -> None:
    r = run_sandboxed(env, {"PrivateUsers": "yes"}, parts="probe")
    assert r["probe"]["rc"] != 0
    assert "Operation not permitted" in r["probe"]["error"] or "privileges" in r["probe"]["error"]


def test_proc_subset_hides_the_node_wide_proc_files(env: Env, baseline: dict[str, Any]) -> None:
    r = run_sandboxed(env, {"ProcSubset": "pid"}, parts="facts")
    assert all(baseline["facts"]["proc_files"].values())
    assert not any(r["facts"]["proc_files"].values()), r["facts"]["proc_files"]


def test_bpf_maps_do_not_need_locked_memory_here(env: Env, baseline: dict[str, Any]) -> None:
    """On kernels >= 5.11 BPF memory is charged to the cgroup, not RLIMIT_MEMLOCK: the probes
    load with no locked memory at all. LimitMEMLOCK=infinity is for older kernels."""
    r = run_sandboxed(env, {"LimitMEMLOCK": "0"}, parts="probe,hooks,facts")
    assert r["facts"]["memlock"] == 0
    assert r["probe"]["states"] == baseline["probe"]["states"]
    assert "compile" not in r["hooks"]


def _has_gpu() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


needs_gpu = pytest.mark.skipif(not _has_gpu(), reason="no NVIDIA GPU on this machine")


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("mdwe", ["seccomp", "prctl"])
def test_nvml_answers_under_the_whole_unit(mdwe: str, env: Env) -> None:
    plain = run_sandboxed(env, {}, parts="nvml")["nvml"]
    r = run_sandboxed(env, whole_unit(), parts="nvml,facts", mdwe=mdwe)
    assert plain["gpus"] >= 1 and not [k for k, v in plain.items() if _failed(v)], plain
    assert r["nvml"]["gpus"] == plain["gpus"] and set(r["nvml"]) == set(plain)
    assert not [k for k, v in r["nvml"].items() if _failed(v)], r["nvml"]


@pytest.mark.gpu
@needs_gpu
def test_private_devices_hides_the_gpus_from_nvml(env: Env) -> None:
    r = run_sandboxed(env, {"PrivateDevices": "yes"}, parts="nvml")
    assert r["nvml"].get("gpus", 0) == 0, r["nvml"]


def test_every_unit_option_is_emulated_or_covered_elsewhere() -> None:
    unknown = set(unit_settings()) - set(SANDBOX) - NOT_SANDBOX
    assert not unknown, (
        f"unit options without an emulation here or a test in test_systemd: {unknown}"
    )


def main(argv: list[str]) -> int:
    if argv[0] == "sandbox":
        split = argv.index("--")
        apply_sandbox(json.loads(argv[1]))
        os.execvp(argv[split + 1], argv[split + 1 :])
    p = argparse.ArgumentParser(prog="test_hardening load")
    p.add_argument("--parts", default="probe,hooks,plumbing,facts")
    p.add_argument("--duration", default="2s")
    p.add_argument("--other-pid", type=int, required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--notify", required=True)
    args = p.parse_args(argv[1:])
    print(json.dumps(run_load(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
