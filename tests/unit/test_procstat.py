"""The kernel-counter sampler (probes/procstat.py), what shows CPUs when the irq or cstate
probe cannot run: deltas of /proc/stat, /proc/interrupts, /proc/softirqs and cpuidle sysfs
between two reads of a recorded tree, remote IRQs flagged by the topology."""

from __future__ import annotations

import os
from pathlib import Path

from gpujitter.probes.host import HostPaths
from gpujitter.probes.procstat import ProcCpuSampler
from gpujitter.probes.topology import Topology, idle_residency_ns

S = 1_000_000_000


def write_proc(root: Path, irq36: int, timer: int, idle_us: int, stat_irq: int) -> HostPaths:
    paths = HostPaths.under(root)
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc/stat").write_text(
        "cpu  1 0 1 100 0 0 0 0 0 0\n"
        f"cpu0 1 0 1 50 0 {stat_irq} 7 0 0 0\n"
        "cpu1 1 0 1 50 0 0 3 0 0 0\n"
        "intr 0\n"
    )
    (root / "proc/interrupts").write_text(
        "           CPU0       CPU1       \n"
        f" 36:   {irq36}    0   PCI-MSI 1-edge      nvme0q3\n"
        " LOC:   10    20   Local timer interrupts\n"
    )
    (root / "proc/softirqs").write_text(
        f"                    CPU0       CPU1       \n       TIMER:   {timer}   0\n"
    )
    for cpu_n in (0, 1):
        state = root / f"sys/devices/system/cpu/cpu{cpu_n}/cpuidle/state1"
        state.mkdir(parents=True, exist_ok=True)
        (state / "name").write_text("C1\n")
        (state / "time").write_text(f"{idle_us}\n")
    return paths


def test_kernel_counter_sampler_gives_deltas_and_flags_remote_irqs(tmp_path: Path) -> None:
    topo = Topology(cpu_node={0: 0, 1: 1}, irq_node={36: 1})
    paths = write_proc(tmp_path, irq36=100, timer=10, idle_us=1000, stat_irq=2)
    sampler = ProcCpuSampler(topo, paths)
    assert sampler.sample(10 * S) == []  # the baseline
    write_proc(tmp_path, irq36=160, timer=15, idle_us=401_000, stat_irq=5)
    rows = {r["cpu"]: r for r in sampler.sample(11 * S)}
    tick = 10**9 // os.sysconf("SC_CLK_TCK")  # /proc/stat counts in USER_HZ ticks
    zero = rows[0]
    assert (zero["ts_ns"], zero["interval_ns"], zero["hardirq_ns"]) == (10 * S, S, 3 * tick)
    assert zero["idle_ns"] == (("C1", 400_000_000),)
    assert zero["top_irqs"] == (("nvme0q3", 0, 60), ("TIMER", 0, 5))
    assert zero["remote_irqs"] == (("nvme0q3", 0, 60),)  # device on node 1, CPU 0 on node 0
    assert rows[1]["top_irqs"] == () and rows[1]["hardirq_ns"] == 0
    idle_only = ProcCpuSampler(topo, paths, irq=False)
    idle_only.sample(1)
    assert all(r["top_irqs"] == () and r["idle_ns"] for r in idle_only.sample(2))


def test_idle_residency_is_read_in_state_order(tmp_path: Path) -> None:
    cpuidle = tmp_path / "cpuidle"
    for index, name, usec in ((10, "C10", "7"), (2, "C2", "5"), (0, "POLL", "x")):
        state = cpuidle / f"state{index}"
        state.mkdir(parents=True)
        (state / "name").write_text(name + "\n")
        (state / "time").write_text(usec + "\n")
    assert list(idle_residency_ns(cpuidle).items()) == [("C2", 5000), ("C10", 7000)]
    assert idle_residency_ns(tmp_path / "none") == {}
