"""irq probe, the parts that need no kernel: /proc/interrupts as recorded on the
development VM, names of the sources, and the remote flag under topologies."""

from __future__ import annotations

from pathlib import Path

from gpujitter.probes import registry
from gpujitter.probes.host import HostPaths
from gpujitter.probes.interrupts import read_table
from gpujitter.probes.irq import HARDIRQ, SOFTIRQ, VECTOR, IrqId, IrqProbe
from gpujitter.probes.topology import Topology


def test_proc_interrupts_lines_are_split_into_counts_and_names(fixtures: Path) -> None:
    lines = read_table(HostPaths.under(fixtures / "irq/vm-2cpu"))
    assert lines["36"].name == "virtio1-req.0"
    assert lines["36"].per_cpu == {0: 0, 1: lines["36"].total}
    assert lines["24"].name == "ACPI:Ged"  # chip "IO-APIC" and hwirq "5-edge" dropped
    assert lines["24"].words == ("IO-APIC", "5-edge", "ACPI:Ged")
    assert lines["LOC"].name == "Local timer interrupts" and not lines["LOC"].numbered
    assert set(lines["LOC"].per_cpu) == {0, 1}
    assert (lines["ERR"].per_cpu, lines["ERR"].total) == ({}, 0)  # one system-wide count
    assert read_table(HostPaths.under(fixtures / "missing")) == {}


def test_sources_are_named_as_the_kernel_names_them() -> None:
    probe = IrqProbe(registry.get("irq"))
    assert probe.name_of(IrqId(SOFTIRQ, 0, 3)) == "NET_RX"
    assert probe.name_of(IrqId(SOFTIRQ, 0, 9)) == "RCU"
    assert probe.name_of(IrqId(VECTOR, 0, 236)) == "local_timer"
    assert probe.name_of(IrqId(VECTOR, 3, 251)) == "call_function_single"


def test_remote_means_device_node_known_and_not_the_handling_cpus() -> None:
    probe = IrqProbe(registry.get("irq"))
    probe.topology = Topology(cpu_node={0: 0, 1: 1}, irq_node={36: 1, 40: -1})
    disk = IrqId(HARDIRQ, 0, 36)
    assert probe.remote(disk, cpu=0)
    assert not probe.remote(disk, cpu=1)
    assert not probe.remote(IrqId(HARDIRQ, 0, 40), cpu=0)  # device node unknown (-1)
    assert not probe.remote(IrqId(HARDIRQ, 0, 41), cpu=0)  # not in the map
    assert not probe.remote(IrqId(VECTOR, 0, 36), cpu=0)  # vectors have no device
