"""Every audit rule on a good and a bad recorded tree, asserting the exact finding: the
two-socket server tuned well (two-node-gpu) and badly (two-node-gpu-bad laid over it), this
dev VM and the H200 VM (NVML played back)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from gpujitter.daemon.checks.audit import AuditContext, Finding, GpuProcess, Reading, run_audit
from gpujitter.daemon.checks.audit.processes import find_gpu_processes
from gpujitter.errors import GpujitterError
from gpujitter.probes.host import HostPaths
from gpujitter.probes.nvml import Nvml
from gpujitter.probes.topology import Topology, load_topology
from tests.fixtures.hosts.record import keep_audited_env
from tests.nvml_playback import PlaybackBackend
from tests.unit.conftest import HOSTS, MakeTree
from tests.unit.forked import in_child, without_dac_override

GOOD = ("two-node-gpu",)
BAD = ("two-node-gpu", "two-node-gpu-bad")
JEMALLOC_CONF = "narenas:8,dirty_decay_ms:10000,muzzy_decay_ms:10000,background_thread:true"
# The status of root's irqbalance (the two-node trees record only its comm).
# What the auditor is told: as a user, to run as root; as root short of capabilities (the
# tests' child, as_another_user), that root is refused too.
CURE = (
    "refused to root here too (a container's capabilities)" if os.geteuid() == 0 else "run as root"
)
DENIED = f"not readable: Permission denied: {CURE}"


def audit(
    paths: HostPaths,
    rule: str,
    *,
    pids: tuple[int, ...] = (),
    nvml: Nvml | None = None,
    topology: Topology | None = None,
    override: Path | None = None,
) -> list[Finding]:
    topo = topology or load_topology(paths, override, nvml=nvml or False)
    procs = find_gpu_processes(paths, topo, pids, nvml)
    return run_audit(AuditContext(paths=paths, topology=topo, processes=procs), [rule])


def ev(paths: HostPaths, rel: str, value: str) -> Reading:
    root = paths.proc.parent
    return Reading(str(root / rel), value)


def as_another_user(call: Callable[[], object]) -> object:
    """What `call` returns meeting the tree's permission bits as a user auditing another's
    processes does (files made unreadable, chmod 0, refuse it)."""
    return in_child(call, without_dac_override)


def unreadable(paths: HostPaths, *rels: str) -> None:
    for rel in rels:
        (paths.proc.parent / rel).chmod(0)


# --- memory -------------------------------------------------------------------------------

SWAPS_NONE = "no swap device listed"
SWAPS_ONE = "/swapfile file 8388604 524288 -2"


def test_swappiness_good(host_tree: MakeTree) -> None:
    p = host_tree(*GOOD)
    assert audit(p, "memory.swappiness") == [
        Finding(
            "memory.swappiness",
            "ok",
            "vm.swappiness",
            "10: page cache is reclaimed well before anonymous memory is swapped",
            (ev(p, "proc/sys/vm/swappiness", "10"),),
        )
    ]


def test_swappiness_bad(host_tree: MakeTree) -> None:
    p = host_tree(*BAD)
    assert audit(p, "memory.swappiness") == [
        Finding(
            "memory.swappiness",
            "warn",
            "vm.swappiness",
            "60: anonymous memory is swapped early; 1-10 is the usual advice",
            (ev(p, "proc/sys/vm/swappiness", "60"), ev(p, "proc/swaps", SWAPS_ONE)),
            "sysctl -w vm.swappiness=10 && echo 'vm.swappiness = 10' >> "
            "/etc/sysctl.d/90-gpujitter.conf",
        )
    ]


def test_swappiness_zero_does_not_disable_swap(host_tree: MakeTree) -> None:
    p = host_tree(*GOOD, files={"proc/sys/vm/swappiness": "0\n"})
    (finding,) = audit(p, "memory.swappiness")
    assert finding.severity == "warn"
    assert finding.message.startswith("0 does not fully disable swap on current kernels")
    assert finding.fix.startswith("sysctl -w vm.swappiness=10")


def test_swappiness_without_swap_devices_is_information(host_tree: MakeTree) -> None:
    p = host_tree("dev-vm")
    (finding,) = audit(p, "memory.swappiness")
    assert finding.severity == "info"
    assert "no swap device is active now" in finding.message
    assert finding.evidence[1] == ev(p, "proc/swaps", SWAPS_NONE)


def test_swap_devices_good(host_tree: MakeTree) -> None:
    p = host_tree(*GOOD)
    assert audit(p, "memory.swap") == [
        Finding(
            "memory.swap",
            "ok",
            "swap devices",
            "no swap device is active",
            (ev(p, "proc/swaps", SWAPS_NONE),),
        )
    ]


def test_swap_devices_bad(host_tree: MakeTree) -> None:
    p = host_tree(*BAD)
    assert audit(p, "memory.swap") == [
        Finding(
            "memory.swap",
            "warn",
            "swap devices",
            "1 active: /swapfile (file, 8191 MiB, 512 MiB used); a swap-in on the GPU-feeding "
            "path costs orders of magnitude more than RAM (GPU nodes usually run without swap)",
            (ev(p, "proc/swaps", SWAPS_ONE),),
            "swapoff -a  # and remove swap entries from /etc/fstab",
        )
    ]


@pytest.mark.parametrize(
    ("knob", "good", "bad_message"),
    [
        (
            "enabled",
            "always madvise [never]",
            "always: every anonymous fault may allocate a huge page and khugepaged collapses "
            "pages behind running threads (latency-critical nodes: madvise or never)",
        ),
        (
            "defrag",
            "always defer [defer+madvise] madvise never",
            "always: page faults compact memory synchronously when no huge page is free "
            "(latency-critical nodes: madvise or never)",
        ),
    ],
)
def test_transparent_hugepages(host_tree: MakeTree, knob: str, good: str, bad_message: str) -> None:
    rel = f"sys/kernel/mm/transparent_hugepage/{knob}"
    g = host_tree(*GOOD)
    mode = good.split("[")[1].split("]")[0]
    assert audit(g, f"memory.thp_{knob}") == [
        Finding(
            f"memory.thp_{knob}", "ok", f"transparent_hugepage/{knob}", mode, (ev(g, rel, good),)
        )
    ]
    b = host_tree(*BAD)
    (finding,) = audit(b, f"memory.thp_{knob}")
    assert finding == Finding(
        f"memory.thp_{knob}",
        "warn",
        f"transparent_hugepage/{knob}",
        bad_message,
        (ev(b, rel, (Path(b.sys) / f"kernel/mm/transparent_hugepage/{knob}").read_text().strip()),),
        f"echo madvise > /sys/kernel/mm/transparent_hugepage/{knob}",
    )


def test_numa_balancing(host_tree: MakeTree) -> None:
    g = host_tree(*GOOD)
    assert audit(g, "memory.numa_balancing") == [
        Finding(
            "memory.numa_balancing",
            "ok",
            "kernel.numa_balancing",
            "0 (off)",
            (ev(g, "proc/sys/kernel/numa_balancing", "0"),),
        )
    ]
    b = host_tree(*BAD)
    fix = (
        "sysctl -w kernel.numa_balancing=0 && echo 'kernel.numa_balancing = 0' >> "
        "/etc/sysctl.d/90-gpujitter.conf"
    )
    assert audit(b, "memory.numa_balancing") == [
        Finding(
            "memory.numa_balancing",
            "warn",
            "kernel.numa_balancing",
            "1 (on): NUMA hinting faults and page migrations hit GPU-feeding threads; bind "
            "processes to their GPU's node instead",
            (ev(b, "proc/sys/kernel/numa_balancing", "1"),),
            fix,
        )
    ]
    one_node = host_tree("dev-vm", files={"proc/sys/kernel/numa_balancing": "1\n"})
    (finding,) = audit(one_node, "memory.numa_balancing")
    assert (
        finding.severity == "info"
        and "with one NUMA node it has nothing to move" in finding.message
    )


# The development VM's balloon (12-06): STATS_VQ, DEFLATE_ON_OOM, REPORTING, VERSION_1.
BALLOON_FEATURES = "0110010100000000000000000000000010000000000000000000000000000000"
BALLOON = "sys/bus/virtio/drivers/virtio_balloon/virtio0/features"


def test_free_page_reporting(host_tree: MakeTree) -> None:
    """A VM whose host takes back what it frees: first touches there took 150-650 us at
    random (docs/accuracy.md), faults the probe cannot time."""
    g = host_tree(*GOOD)
    (finding,) = audit(g, "memory.page_reporting")
    assert (finding.severity, finding.message) == ("ok", "no virtio balloon device")
    quiet = BALLOON_FEATURES[:5] + "0" + BALLOON_FEATURES[6:]
    (finding,) = audit(host_tree(*GOOD, files={BALLOON: quiet + "\n"}), "memory.page_reporting")
    assert (finding.severity, finding.message) == ("ok", "not negotiated by the balloon")
    vm = host_tree(*GOOD, files={BALLOON: BALLOON_FEATURES + "\n"})
    (finding,) = audit(vm, "memory.page_reporting")
    assert finding.severity == "warn" and finding.message.startswith("on (virtio0): the host")
    assert finding.evidence == (ev(vm, BALLOON, BALLOON_FEATURES),)
    assert "freePageReporting='off'" in finding.fix
    # A features file cut short (an old kernel's, or unreadable) is not read as reporting.
    (finding,) = audit(host_tree(*GOOD, files={BALLOON: "0110\n"}), "memory.page_reporting")
    assert finding.severity == "ok"


def test_damon_paging_out(host_tree: MakeTree) -> None:
    kd = "sys/kernel/mm/damon/admin/kdamonds"
    g = host_tree(*GOOD)
    (finding,) = audit(g, "memory.damon")
    assert (finding.severity, finding.message) == ("ok", "not running")
    scheme = {
        f"{kd}/0/state": "on\n",
        f"{kd}/0/contexts/0/operations": "paddr\n",
        f"{kd}/0/contexts/0/schemes/0/action": "pageout\n",
    }
    vm = host_tree(*GOOD, files=scheme)
    assert audit(vm, "memory.damon") == [
        Finding(
            "memory.damon",
            "warn",
            "DAMON",
            "pages out any memory it finds cold (kdamond 0): a job's buffers idle between "
            "uses are reclaimed, and fault back in on the feeding path",
            (ev(vm, f"{kd}/0/state", "on"),
             ev(vm, f"{kd}/0/contexts/0/schemes/0/action", "pageout"),
             ev(vm, f"{kd}/0/contexts/0/operations", "paddr")),
            "echo off > /sys/kernel/mm/damon/admin/kdamonds/0/state",
        )
    ]  # fmt: skip
    # On chosen processes' address spaces only: said, not warned.
    (finding,) = audit(
        host_tree(*GOOD, files={**scheme, f"{kd}/0/contexts/0/operations": "vaddr\n"}),
        "memory.damon",
    )
    assert finding.severity == "info" and "target processes only (kdamond 0)" in finding.message
    # Stopped, or only watching (a `stat` scheme): nothing is paged out.
    for files in ({**scheme, f"{kd}/0/state": "off\n"},
                  {**scheme, f"{kd}/0/contexts/0/schemes/0/action": "stat\n"}):  # fmt: skip
        (finding,) = audit(host_tree(*GOOD, files=files), "memory.damon")
        assert (finding.severity, finding.message) == ("ok", "no kdamond pages memory out")
    reclaim = host_tree(*GOOD, files={"sys/module/damon_reclaim/parameters/enabled": "Y\n"})
    (finding,) = audit(reclaim, "memory.damon")
    assert finding.severity == "warn" and "(DAMON_RECLAIM)" in finding.message
    assert finding.fix == "echo N > /sys/module/damon_reclaim/parameters/enabled"


def test_what_makes_this_nodes_faults_slow_is_said(host_tree: MakeTree) -> None:
    """The fault drills missed their attributed target on a VM whose host took its memory
    back, and the daemon read those faults as host work, saying nothing of it: both now say
    the audit's warnings of that kind (the daemon's start: test_process_environment)."""
    from gpujitter.daemon.checks.audit import slow_fault_notes

    good = host_tree(*GOOD)
    assert slow_fault_notes(good, load_topology(good)) == []
    vm = host_tree(*GOOD, files={BALLOON: BALLOON_FEATURES + "\n"})
    (note,) = slow_fault_notes(vm, load_topology(vm))
    assert note.startswith("memory.page_reporting: on (virtio0): the host takes back")


# --- cpu ----------------------------------------------------------------------------------


def test_governor(host_tree: MakeTree) -> None:
    g = host_tree(*GOOD)
    rel = "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
    assert audit(g, "cpu.governor") == [
        Finding(
            "cpu.governor", "ok", "cpufreq", "performance on CPUs 0-7", (ev(g, rel, "performance"),)
        )
    ]
    b = host_tree(*BAD)
    assert audit(b, "cpu.governor") == [
        Finding(
            "cpu.governor",
            "warn",
            "cpufreq",
            "powersave on CPUs 0-7: CPUs ramp up only after work arrives, so bursts of launches "
            "run slow",
            (ev(b, rel, "powersave"),),
            "cpupower frequency-set -g performance",
        )
    ]
    vm = host_tree("dev-vm")
    assert audit(vm, "cpu.governor") == [
        Finding(
            "cpu.governor",
            "info",
            "cpufreq",
            "no cpufreq driver: the platform or the hypervisor sets the CPU frequency",
            (ev(vm, rel, "absent"),),
        )
    ]


def test_idle_states(host_tree: MakeTree) -> None:
    g = host_tree(*GOOD)
    assert audit(g, "cpu.idle_states") == [
        Finding(
            "cpu.idle_states",
            "ok",
            "cpuidle",
            "driver intel_idle: deepest enabled state C1E exits in 10 us (<= 10 us)",
            (ev(g, "sys/devices/system/cpu/cpuidle/current_driver", "intel_idle"),),
        )
    ]
    b = host_tree(*BAD)
    assert audit(b, "cpu.idle_states") == [
        Finding(
            "cpu.idle_states",
            "warn",
            "cpuidle",
            "driver intel_idle: enabled states that take over 10 us to leave: C6 (133 us) on "
            "CPUs 0-7; a thread woken there starts that much later (disabling them costs power)",
            (ev(b, "sys/devices/system/cpu/cpu0/cpuidle/state3/latency", "133"),),
            "cpupower idle-set -D 10",
        )
    ]


def test_idle_states_without_a_cpuidle_driver(host_tree: MakeTree) -> None:
    vm = host_tree("dev-vm")
    assert audit(vm, "cpu.idle_states") == [
        Finding(
            "cpu.idle_states",
            "info",
            "cpuidle",
            "no cpuidle driver: CPUs idle in the default HLT state, whose exit latency the "
            "kernel does not know; in a VM every HLT exits to the hypervisor, so a wake-up "
            "costs tens of us",
            (ev(vm, "sys/devices/system/cpu/cpuidle/current_driver", "none"),),
            "modprobe cpuidle-haltpoll",
        )
    ]


# --- irqs ---------------------------------------------------------------------------------


def test_irqbalance(host_tree: MakeTree) -> None:
    g = host_tree(*GOOD)
    assert audit(g, "irq.irqbalance") == [
        Finding(
            "irq.irqbalance",
            "ok",
            "irqbalance",
            "running (pid 1500), keeps IRQs off CPUs 0-1,4-5",
            (
                ev(g, "proc/1500/comm", "irqbalance"),
                ev(g, "proc/1500/status", "Uid: 0"),
                ev(g, "etc/default/irqbalance", "IRQBALANCE_BANNED_CPULIST=0-1,4-5"),
            ),
        )
    ]
    b = host_tree(*BAD)
    assert audit(b, "irq.irqbalance") == [
        Finding(
            "irq.irqbalance",
            "warn",
            "irqbalance",
            "running (pid 1500) with no banned CPUs: it moves IRQs, GPU and NIC ones included, "
            "onto GPU-feeding CPUs and undoes affinity set by hand",
            (ev(b, "proc/1500/comm", "irqbalance"), ev(b, "proc/1500/status", "Uid: 0")),
            "systemctl disable --now irqbalance  # or set IRQBALANCE_BANNED_CPULIST",
        )
    ]
    vm = host_tree("dev-vm")
    (finding,) = audit(vm, "irq.irqbalance")
    assert (finding.severity, finding.message) == (
        "ok",
        "not running: IRQ affinity stays where it is set",
    )


def test_irqbalance_ban_mask_from_its_environment(host_tree: MakeTree) -> None:
    env = b"PATH=/usr/bin\0IRQBALANCE_BANNED_CPUS=00000033\0"
    p = host_tree(*BAD)
    (p.proc / "1500/environ").write_bytes(env)
    (finding,) = audit(p, "irq.irqbalance")
    assert finding.severity == "ok" and finding.message.endswith("keeps IRQs off CPUs 0-1,4-5")
    assert finding.evidence[2] == ev(p, "proc/1500/environ", "IRQBALANCE_BANNED_CPUS=00000033")


def test_irqbalance_is_only_roots(host_tree: MakeTree) -> None:
    """Any user may name a process irqbalance (prctl): the audit took such a process, with
    the bans its owner chose, for the daemon, and judged only the first one found."""
    fake = {
        "proc/1400/comm": "irqbalance\n",
        "proc/1400/status": "Name:\tirqbalance\nUid:\t65534\t65534\t65534\t65534\n",
        "proc/1400/environ": "IRQBALANCE_BANNED_CPULIST=0-7\0",
    }
    vm = host_tree("dev-vm", files=fake)
    assert audit(vm, "irq.irqbalance") == [
        Finding(
            "irq.irqbalance",
            "ok",
            "irqbalance",
            "not running: IRQ affinity stays where it is set",
            (
                Reading(str(vm.proc / "*/comm"), "no root process named irqbalance"),
                ev(vm, "proc/1400/status", "Uid: 65534 (not root)"),
            ),
        )
    ]
    beside = host_tree(*BAD, files=fake)
    (finding,) = audit(beside, "irq.irqbalance")
    assert (finding.severity, finding.message.split(" with ")[0]) == ("warn", "running (pid 1500)")
    unknown = host_tree(*GOOD, files={"proc/1500/status": None})  # whose: cannot be told
    assert audit(unknown, "irq.irqbalance") == [
        Finding(
            "irq.irqbalance",
            "info",
            "irqbalance",
            "not checked: a process named irqbalance (pid 1500) runs, whose owner is not known "
            "(its status not readable)",
            (ev(unknown, "proc/1500/status", "absent"),),
        )
    ]


def test_irqbalance_whose_environ_cannot_be_read(host_tree: MakeTree) -> None:
    """Root's irqbalance audited by another user: its environ (where the bans usually are)
    read as empty, and the audit warned "no banned CPUs" with a fix to disable it."""
    b = host_tree(*BAD, files={"proc/1500/environ": "PATH=/usr/bin\0"})
    unreadable(b, "proc/1500/environ")
    assert as_another_user(lambda: audit(b, "irq.irqbalance")) == [
        Finding(
            "irq.irqbalance",
            "info",
            "irqbalance",
            "running (pid 1500); its banned CPUs not known: its environ not readable",
            (
                ev(b, "proc/1500/comm", "irqbalance"),
                ev(b, "proc/1500/status", "Uid: 0"),
                ev(b, "proc/1500/environ", DENIED),
            ),
        )
    ]


def test_irq_affinity_good(host_tree: MakeTree) -> None:
    g = host_tree(*GOOD)
    eff = "proc/irq/{}/effective_affinity_list"
    assert audit(g, "irq.affinity") == [
        Finding(
            "irq.affinity",
            "ok",
            "gpu 0000:17:00.0",
            "1 of 1 IRQ(s) handled on node 0's CPUs",
            (ev(g, eff.format(100), "1"),),
        ),
        Finding(
            "irq.affinity",
            "ok",
            "nic ens1f0",
            "4 of 4 IRQ(s) handled on node 0's CPUs",
            tuple(ev(g, eff.format(i), str(i - 110)) for i in (110, 111, 112, 113)),
        ),
        Finding(
            "irq.affinity",
            "ok",
            "gpu 0000:b1:00.0",
            "1 of 1 IRQ(s) handled on node 1's CPUs",
            (ev(g, eff.format(101), "5"),),
        ),
        Finding(
            "irq.affinity",
            "ok",
            "nvme nvme0",
            "2 of 4 IRQ(s) handled on node 1's CPUs; 2 kernel-managed queue vector(s) "
            "(nvme0q1, nvme0q2) sit on other nodes' CPUs by design and fire only for I/O "
            "submitted there",
            (
                ev(g, eff.format(120), "4"),
                ev(g, eff.format(123), "6"),
                ev(g, eff.format(121), "0"),
                ev(g, eff.format(122), "2"),
            ),
        ),
    ]


def test_irq_affinity_bad(host_tree: MakeTree) -> None:
    b = host_tree(*BAD)
    warned = [f for f in audit(b, "irq.affinity") if f.severity != "ok"]
    assert warned == [
        Finding(
            "irq.affinity",
            "warn",
            "IRQ 111 mlx5_comp0@pci:0000:41:00.0",
            "nic ens1f0: handled on CPUs 6 (node 1), remote from its device on node 0",
            (
                ev(b, "proc/irq/111/effective_affinity_list", "6"),
                ev(b, "sys/bus/pci/devices/0000:41:00.0/numa_node", "0"),
            ),
            "echo 0-3 > /proc/irq/111/smp_affinity_list",
        ),
        Finding(
            "irq.affinity",
            "warn",
            "IRQ 101 nvidia",
            "gpu 0000:b1:00.0: handled on CPUs 0 (node 0), remote from its device on node 1",
            (
                ev(b, "proc/irq/101/effective_affinity_list", "0"),
                ev(b, "sys/bus/pci/devices/0000:b1:00.0/numa_node", "1"),
            ),
            "echo 4-7 > /proc/irq/101/smp_affinity_list",
        ),
    ]


def test_irq_affinity_against_an_override(host_tree: MakeTree, tmp_path: Path) -> None:
    """On the one-node VM, an override puts the disk on node 0 and CPU 1 on node 1: the disk
    IRQ, pinned to CPU 1, becomes remote, and the evidence names the override file."""
    p = host_tree("dev-vm", files={"proc/irq/36/effective_affinity_list": "1\n"})
    override = tmp_path / "split.toml"
    override.write_text('[nodes]\n0 = "0"\n1 = "1"\n[irqs]\n35 = 0\n36 = 0\n')
    findings = audit(p, "irq.affinity", override=override)
    (disk,) = [f for f in findings if f.subject == "IRQ 36 virtio1-req.0"]
    assert disk == Finding(
        "irq.affinity",
        "warn",
        "IRQ 36 virtio1-req.0",
        "block vda: handled on CPUs 1 (node 1), remote from its device on node 0",
        (
            ev(p, "proc/irq/36/effective_affinity_list", "1"),
            Reading(str(override), "[irqs] 36 = 0"),
        ),
        "echo 0 > /proc/irq/36/smp_affinity_list",
    )
    (nic,) = [f for f in findings if f.subject == "nic eth0"]
    assert nic.severity == "info" and nic.message.startswith("NUMA node of the device unknown")


def test_irq_affinity_naming_offline_cpus(host_tree: MakeTree) -> None:
    """CPU 1 offline on a kernel without effective_affinity_list: smp_affinity_list still
    names it, and the audit called CPU 1 (node unknown, taken for 0) "remote" from a device
    on node 0. An IRQ whose only CPU is offline is said to be so."""
    irqs = [d.name for d in (HOSTS / "dev-vm/proc/irq").iterdir()]
    files: dict[str, str | None] = {f"proc/irq/{n}/effective_affinity_list": None for n in irqs}
    files |= {"sys/devices/system/cpu/online": "0\n", "proc/irq/36/smp_affinity_list": "1\n"}
    p = host_tree("dev-vm", files=files)
    assert audit(p, "irq.affinity") == [
        Finding(
            "irq.affinity",
            "info",
            "IRQ 36 virtio1-req.0",
            "block vda: its affinity names only offline CPUs 1: where it is handled is not known",
            (
                ev(p, "proc/irq/36/smp_affinity_list", "1"),
                ev(p, "sys/devices/system/cpu/online", "0"),
            ),
        ),
        Finding(
            "irq.affinity",
            "ok",
            "block vda",
            "1 of 2 IRQ(s) handled on node 0's CPUs (one NUMA node: every CPU is local)",
            (ev(p, "proc/irq/35/smp_affinity_list", "0-1"),),
        ),
        Finding(
            "irq.affinity",
            "ok",
            "nic eth0",
            "3 of 3 IRQ(s) handled on node 0's CPUs (one NUMA node: every CPU is local)",
            tuple(ev(p, f"proc/irq/{n}/smp_affinity_list", "0-1") for n in (37, 38, 39)),
        ),
    ]


# --- gpus ---------------------------------------------------------------------------------


def test_persistence_from_nvml(host_tree: MakeTree, h200_nvml: PlaybackBackend) -> None:
    p = host_tree("h200-vm")
    nvml = Nvml(h200_nvml).open()
    assert audit(p, "gpu.persistence", nvml=nvml) == [
        Finding(
            "gpu.persistence",
            "ok",
            "GPU 0 (0000:00:06.0)",
            "persistence mode on",
            (Reading("NVML nvmlDeviceGetPersistenceMode", "enabled"),),
        )
    ]
    topo = load_topology(p, nvml=Nvml(h200_nvml).open())
    off = replace(topo, gpus=tuple(replace(g, persistence_mode=False) for g in topo.gpus))
    assert audit(p, "gpu.persistence", topology=off) == [
        Finding(
            "gpu.persistence",
            "warn",
            "GPU 0 (0000:00:06.0)",
            "persistence mode off: when no process holds the GPU the driver unloads its state, "
            "and the next CUDA start takes a second or two",
            (Reading("NVML nvmlDeviceGetPersistenceMode", "disabled"),),
            "nvidia-smi -i 0 -pm 1",
        )
    ]


def persistenced(uid: int) -> dict[str, str]:
    return {
        "proc/2100/comm": "nvidia-persistenced\n",
        "proc/2100/status": f"Name:\tnvidia-persistenced\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n",
    }


def test_persistence_from_sysfs(host_tree: MakeTree) -> None:
    daemon = host_tree(*GOOD, files=persistenced(118))  # Debian's nvidia-persistenced user
    findings = audit(daemon, "gpu.persistence")
    assert [(f.subject, f.severity, f.message) for f in findings] == [
        ("GPU 0000:17:00.0", "ok", "nvidia-persistenced is running (pid 2100)"),
        ("GPU 0000:b1:00.0", "ok", "nvidia-persistenced is running (pid 2100)"),
    ]
    # Any user may name a process so: a login user's is not the driver's daemon.
    anyones = audit(host_tree(*GOOD, files=persistenced(1000)), "gpu.persistence")
    assert [f.severity for f in anyones] == ["info", "info"]
    b = host_tree(*BAD)
    unknown = audit(b, "gpu.persistence")
    assert [(f.severity, f.fix) for f in unknown] == [
        ("info", "nvidia-smi -i 0000:17:00.0 -pm 1"),
        ("info", "nvidia-smi -i 0000:b1:00.0 -pm 1"),
    ]
    assert audit(host_tree("dev-vm"), "gpu.persistence")[0].message.startswith("no NVIDIA GPU")


# --- processes ----------------------------------------------------------------------------


def test_gpu_processes_found_by_libcuda_and_dev_nvidia(host_tree: MakeTree) -> None:
    p = host_tree(*BAD)
    topo = load_topology(p)
    assert find_gpu_processes(p, topo) == [
        GpuProcess(4242, "python3", ("0000:b1:00.0",), "libcuda"),
        GpuProcess(4343, "python3", ("0000:17:00.0",), "libcuda"),
    ]


def test_gpu_processes_from_nvml(host_tree: MakeTree, h200_nvml: PlaybackBackend) -> None:
    p = host_tree("h200-vm")
    nvml = Nvml(h200_nvml).open()
    topo = load_topology(p, nvml=nvml)
    assert find_gpu_processes(p, topo, (), nvml) == [
        GpuProcess(523, "python3", ("0000:00:06.0",), "nvml")
    ]


def test_pid_option(host_tree: MakeTree) -> None:
    p = host_tree("dev-vm")
    topo = load_topology(p)
    (proc,) = find_gpu_processes(p, topo, (4467,))
    assert (proc.pid, proc.gpus, proc.found_by) == (4467, (), "--pid")
    with pytest.raises(GpujitterError, match="--pid 999999: no such process"):
        find_gpu_processes(p, topo, (999999,))


def test_pid_of_a_thread_or_a_zombie_is_refused(host_tree: MakeTree) -> None:
    """/proc/TID/status exists for every thread, and a zombie's maps read empty: both were
    audited as processes (a thread listed as one; a zombie given memlock and allocator
    fixes)."""
    p = host_tree(
        "dev-vm",
        files={
            "proc/4468/status": "Name:\tpython3\nState:\tS (sleeping)\nTgid:\t4467\n",
            "proc/4469/status": "Name:\tpython3\nState:\tZ (zombie)\nTgid:\t4469\n",
        },
    )
    topo = load_topology(p)
    with pytest.raises(GpujitterError, match=r"^--pid 4468: a thread of process 4467; give"):
        find_gpu_processes(p, topo, (4468,))
    with pytest.raises(GpujitterError, match=r"^--pid 4469: exited \(a zombie its parent"):
        find_gpu_processes(p, topo, (4469,))


def test_gpu_processes_whose_maps_cannot_be_read_are_counted(host_tree: MakeTree) -> None:
    """Audited by a user who may not read other users' maps, the audit said "none found (no
    process with libcuda mapped)": a scan that could not look, told as a result."""
    p = host_tree(*BAD)
    unreadable(p, "proc/4343/maps")
    maps = Reading(str(p.proc / "*/maps"), "1 readable, 1 not readable (pids 4343)")
    assert as_another_user(lambda: audit(p, "process.gpus")) == [
        Finding(
            "process.gpus",
            "info",
            "pid 4242 (python3)",
            "uses 0000:b1:00.0 (found by libcuda)",
            (ev(p, "proc/4242/maps", "0000:b1:00.0"),),
        ),
        Finding(
            "process.gpus",
            "info",
            "GPU processes",
            f"the maps of 1 process(es) not readable (Permission denied: {CURE}): GPU "
            "processes among them are found only by NVML or --pid",
            (maps,),
        ),
    ]
    unreadable(p, "proc/4242/maps")
    assert as_another_user(lambda: audit(p, "process.gpus")) == [
        Finding(
            "process.gpus",
            "info",
            "GPU processes",
            "none found among the 0 process(es) whose maps were readable (no NVML compute "
            "process, no process with libcuda mapped); the maps of 2 process(es) not readable "
            f"(Permission denied: {CURE}), or name one with --pid",
            (Reading(maps.file, "no libcuda.so in 0 readable, 2 not readable (pids 4242, 4343)"),),
        )
    ]


def test_no_gpu_process(host_tree: MakeTree) -> None:
    vm = host_tree("dev-vm")
    assert audit(vm, "process.gpus") == [
        Finding(
            "process.gpus",
            "info",
            "GPU processes",
            "none found (no NVML compute process, no process with libcuda mapped); name one "
            "with --pid",
            (Reading(str(vm.proc / "*/maps"), "no libcuda.so"),),
        )
    ]


def test_cpu_affinity(host_tree: MakeTree) -> None:
    g = host_tree(*GOOD)
    assert audit(g, "process.cpu_affinity") == [
        Finding(
            "process.cpu_affinity",
            "ok",
            "pid 4242 (python3)",
            "runs on node 1's CPUs only",
            (ev(g, "proc/4242/status", "Cpus_allowed_list: 4-7"),),
        )
    ]
    b = host_tree(*BAD)
    assert audit(b, "process.cpu_affinity") == [
        Finding(
            "process.cpu_affinity",
            "warn",
            "pid 4242 (python3)",
            "may run on CPUs 0-3, remote from its GPU's node 1",
            (ev(b, "proc/4242/status", "Cpus_allowed_list: 0-7"),),
            "taskset -acp 4-7 4242 && migratepages 4242 all 1",
        ),
        Finding(
            "process.cpu_affinity",
            "critical",
            "pid 4343 (python3)",
            "may run on CPUs 4-7, remote from its GPU's node 0 (it may not run on any local CPU)",
            (ev(b, "proc/4343/status", "Cpus_allowed_list: 4-7"),),
            "taskset -acp 0-3 4343 && migratepages 4343 all 0",
        ),
    ]


def test_memory_policy(host_tree: MakeTree) -> None:
    g = host_tree(*GOOD)
    assert audit(g, "process.memory_policy") == [
        Finding(
            "process.memory_policy",
            "ok",
            "pid 4242 (python3)",
            "memory bound to node 1",
            (
                ev(g, "proc/4242/status", "Mems_allowed_list: 1"),
                ev(g, "proc/4242/numa_maps", "pages N1=90040; policies bind:1 x2"),
            ),
        )
    ]
    b = host_tree(*BAD)
    assert audit(b, "process.memory_policy") == [
        Finding(
            "process.memory_policy",
            "warn",
            "pid 4242 (python3)",
            "90% of its resident pages are off node 1, where its GPU is",
            (
                ev(b, "proc/4242/status", "Mems_allowed_list: 0-1"),
                ev(b, "proc/4242/numa_maps", "pages N0=81040 N1=9000; policies default x2"),
            ),
            "taskset -acp 4-7 4242 && migratepages 4242 all 1",
        ),
        Finding(
            "process.memory_policy",
            "info",
            "pid 4343 (python3)",
            "memory not bound to node 0: its pages are local now (first touch), later "
            "allocations may land remote",
            (
                ev(b, "proc/4343/status", "Mems_allowed_list: 0-1"),
                ev(b, "proc/4343/numa_maps", "pages N0=100; policies default x1"),
            ),
            "numactl --cpunodebind=0 --membind=0 <command>",
        ),
    ]


def test_memlock(host_tree: MakeTree) -> None:
    g = host_tree(*GOOD)
    assert audit(g, "process.memlock") == [
        Finding(
            "process.memlock",
            "ok",
            "pid 4242 (python3)",
            "RLIMIT_MEMLOCK unlimited",
            (ev(g, "proc/4242/limits", "Max locked memory unlimited unlimited bytes"),),
        )
    ]
    b = host_tree(*BAD)
    (finding, _stray) = audit(b, "process.memlock")
    assert finding == Finding(
        "process.memlock",
        "warn",
        "pid 4242 (python3)",
        "RLIMIT_MEMLOCK 8192 KiB: mlock() and RDMA registration (NCCL over InfiniBand, "
        "GPUDirect) of pinned buffers are capped there",
        (ev(b, "proc/4242/limits", "Max locked memory 8388608 8388608 bytes"),),
        "prlimit --pid 4242 --memlock=unlimited:unlimited  # and LimitMEMLOCK=infinity",
    )


def test_allocator(host_tree: MakeTree) -> None:
    g = host_tree(*GOOD)
    jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    env = f"MALLOC_CONF={JEMALLOC_CONF} LD_PRELOAD={jemalloc}"
    assert audit(g, "process.allocator") == [
        Finding(
            "process.allocator",
            "ok",
            "pid 4242 (python3)",
            "jemalloc in use",
            (ev(g, "proc/4242/maps", jemalloc), ev(g, "proc/4242/environ", env)),
        )
    ]
    b = host_tree(*BAD)
    (finding, _stray) = audit(b, "process.allocator")
    assert finding == Finding(
        "process.allocator",
        "info",
        "pid 4242 (python3)",
        "glibc malloc: arena locks and trims (madvise/munmap) can stall data-loader threads",
        (
            ev(b, "proc/4242/maps", "no jemalloc/tcmalloc/mimalloc mapped"),
            ev(b, "proc/4242/environ", "no allocator variables"),
        ),
        f"LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF={JEMALLOC_CONF} <command>",
    )
    # one variable with a byte that is not UTF-8 hid the whole environment
    odd = host_tree(*GOOD)
    environ = odd.proc / "4242" / "environ"
    environ.write_bytes(b"HOME=/home/caf\xe9\0" + environ.read_bytes())
    (finding,) = audit(odd, "process.allocator")
    assert finding.severity == "ok" and finding.evidence[1].value == env
    defaults = host_tree(*GOOD, files={"proc/4242/environ": ""})
    (plain,) = audit(defaults, "process.allocator")
    assert plain.severity == "info" and plain.message.startswith("jemalloc with default settings")
    assert plain.fix == f"MALLOC_CONF={JEMALLOC_CONF} <command>"


def test_files_that_cannot_be_read_are_not_checked(host_tree: MakeTree) -> None:
    """Another user's maps, environ and numa_maps read as empty: the audit said "glibc
    malloc", "no allocator variables" and judged memory by no pages at all."""
    b = host_tree(*BAD)
    unreadable(b, "proc/4343/maps", "proc/4242/environ", "proc/4242/numa_maps")
    found = as_another_user(
        lambda: (
            audit(b, "process.allocator", pids=(4343,))
            + audit(b, "process.memory_policy", pids=(4343,))[:1]
        )
    )
    assert found == [
        Finding(
            "process.allocator",
            "info",
            "pid 4242 (python3)",
            "glibc malloc: arena locks and trims (madvise/munmap) can stall data-loader threads",
            (
                ev(b, "proc/4242/maps", "no jemalloc/tcmalloc/mimalloc mapped"),
                ev(b, "proc/4242/environ", DENIED),
            ),
            f"LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF={JEMALLOC_CONF} <command>",
        ),
        Finding(
            "process.allocator",
            "info",
            "pid 4343 (python3)",
            f"not checked: its maps not readable (Permission denied: {CURE})",
            (ev(b, "proc/4343/maps", DENIED),),
        ),
        Finding(
            "process.memory_policy",
            "info",
            "pid 4242 (python3)",
            f"not checked: its numa_maps not readable (Permission denied: {CURE})",
            (
                ev(b, "proc/4242/status", "Mems_allowed_list: 0-1"),
                ev(b, "proc/4242/numa_maps", DENIED),
            ),
        ),
    ]
    g = host_tree(*GOOD)
    unreadable(g, "proc/4242/environ")
    jemalloc = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    assert as_another_user(lambda: audit(g, "process.allocator")) == [
        Finding(
            "process.allocator",
            "info",
            "pid 4242 (python3)",
            "jemalloc in use; its settings (MALLOC_CONF) not checked: its environ not readable",
            (ev(g, "proc/4242/maps", jemalloc), ev(g, "proc/4242/environ", DENIED)),
        )
    ]


def test_a_mapped_path_with_spaces_is_named_whole(host_tree: MakeTree) -> None:
    """The maps reader keeps a path's spaces (the audit took the line's last word, and named
    "libs/libjemalloc.so.2"); a libcuda and a GPU device under such paths are found too."""
    maps = (HOSTS / "two-node-gpu/proc/4242/maps").read_text()
    spaced = maps.replace("/usr/lib/x86_64-linux-gnu/", "/opt/my libs/")
    paths = host_tree(*GOOD, files={"proc/4242/maps": spaced})
    (finding,) = audit(paths, "process.allocator")
    assert finding.evidence[0] == ev(paths, "proc/4242/maps", "/opt/my libs/libjemalloc.so.2")
    (proc,) = [p for p in find_gpu_processes(paths, load_topology(paths)) if p.pid == 4242]
    assert proc.found_by == "libcuda" and proc.gpus


def test_recorded_environ_keeps_only_allocator_variables() -> None:
    raw = b"HOME=/root\0AWS_SECRET_ACCESS_KEY=x\0MALLOC_CONF=narenas:8\0LD_PRELOAD=/j.so\0"
    assert keep_audited_env(raw) == b"MALLOC_CONF=narenas:8\0LD_PRELOAD=/j.so\0"
    assert keep_audited_env(b"HOME=/root\0") == b""
    assert (
        keep_audited_env(b"IRQBALANCE_BANNED_CPULIST=0-1\0K=v\0")
        == b"IRQBALANCE_BANNED_CPULIST=0-1\0"
    )


def test_whole_audit_of_the_bad_tree_counts(host_tree: MakeTree) -> None:
    p = host_tree(*BAD)
    topo = load_topology(p)
    findings = run_audit(AuditContext(p, topo, find_gpu_processes(p, topo)))
    rules = [f.rule for f in findings]
    # Families print in order: memory, cpu, irq, gpu, process.
    families = [r.split(".")[0] for r in rules]
    assert families == sorted(families, key=["memory", "cpu", "irq", "gpu", "process"].index)
    severities = [f.severity for f in findings]
    assert severities.count("critical") == 1 and severities.count("warn") == 13
    assert all(f.fix for f in findings if f.severity in ("warn", "critical"))


def test_a_recorded_tree_with_a_folder_this_user_may_not_search_is_one_line(
    host_tree: MakeTree,
) -> None:
    """Python's is_dir() raises where a folder on the way may not be searched: `topo` and
    `audit` ended in "internal error: PermissionError" (exit 70)."""
    from gpujitter.cli import main

    paths = host_tree(*GOOD)
    root = paths.proc.parent
    (root / "sys/devices").chmod(0)
    for command in ("topo", "audit"):
        assert as_another_user(lambda c=command: main([c, "--root", str(root), "--no-nvml"])) == 2
