"""Topology readers on recorded trees: this dev VM (no cpuidle driver), the H200 VM (a GPU on
PCI, NVML played back), and a hand-made two-socket server (intel_idle, GPUs, NIC, NVMe)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from gpujitter.probes.host import HostPaths
from gpujitter.probes.nvml import Nvml
from gpujitter.probes.topology import (
    TREE,
    CpuIdle,
    GpuDevice,
    HostDevice,
    IdleState,
    Topology,
    load_topology,
    pci_device,
    read_pci,
)
from tests.fixtures.hosts.record import record_tree
from tests.nvml_playback import PlaybackBackend
from tests.unit.conftest import MakeTree


def test_dev_vm_without_cpuidle_driver_idles_in_default_hlt_state_1(host_tree: MakeTree) -> None:
    topo = load_topology(host_tree("dev-vm"))
    assert topo.cpu_node == {0: 0, 1: 0}
    assert topo.node_distance == {0: (10,)}
    assert topo.idle is not None
    assert topo.idle.driver is None and topo.idle.default_idle
    assert topo.idle.governor == "menu"
    hlt = IdleState(
        index=1,
        name="HLT",
        desc="default idle (no cpuidle driver): arch_cpu_idle, HLT on x86",
        exit_latency_us=None,
        target_residency_us=None,
    )
    assert topo.idle.states == {0: (hlt,), 1: (hlt,)}
    # power:cpu_idle reports state 1 for it; any other number is unknown.
    assert topo.idle.state(1, 1) == hlt
    assert topo.idle.state(1, 0) is None


def test_idle_poll_on_the_command_line_is_state_0(host_tree: MakeTree) -> None:
    topo = load_topology(host_tree("dev-vm", files={"proc/cmdline": "quiet idle=poll\n"}))
    assert topo.idle is not None
    poll = topo.idle.state(0, 0)
    assert poll is not None and poll.name == "POLL" and poll.exit_latency_us == 0


def test_dev_vm_devices_and_irqs(host_tree: MakeTree) -> None:
    topo = load_topology(host_tree("dev-vm"))
    assert topo.gpus == ()
    assert topo.devices == (
        HostDevice("nic", "eth0", "0000:00:03.0", None, (0, 1)),
        HostDevice("block", "vda", "0000:00:02.0", None, (0, 1), dev="254:0"),
    )
    disk = topo.irq(36)
    assert disk is not None
    assert (disk.name, disk.chip, disk.hwirq) == ("virtio1-req.0", "PCI-MSIX-0000:00:02.0", "1")
    assert (disk.device, disk.device_kind, disk.node) == ("0000:00:02.0", "block", None)
    assert disk.affinity == (0, 1) and len(disk.effective_affinity) == 1
    assert set(disk.counts) == {0, 1} and disk.total > 0
    assert topo.irq(24) is not None and topo.irq(24).device is None  # type: ignore[union-attr]
    # numa_node -1 everywhere: no IRQ or GPU node is claimed.
    assert topo.irq_node == {} and topo.gpu_node == {}
    vectors = {v.name: v for v in topo.vectors}
    assert {"LOC", "RES", "CAL", "TLB", "ERR"} <= set(vectors)
    assert vectors["LOC"].desc == "Local timer interrupts" and set(vectors["LOC"].counts) == {0, 1}
    assert vectors["ERR"].counts == {}


def test_h200_gpu_from_sysfs(host_tree: MakeTree) -> None:
    topo = load_topology(host_tree("h200-vm"))
    assert topo.gpu_source == "sysfs (a recorded tree: NVML not asked)"
    assert topo.gpus == (
        GpuDevice(
            bus_id="0000:00:06.0",
            index=None,
            name="NVIDIA H200",
            numa_node=None,
            local_cpus=tuple(range(16)),
            source="sysfs",
            minor=0,
        ),
    )
    gpu_irqs = [i for i in topo.irqs if i.device_kind == "gpu"]
    assert len(gpu_irqs) == 8 and {i.device for i in gpu_irqs} == {"0000:00:06.0"}
    assert [d.name for d in topo.devices] == ["eth0", "vda", "vdb"]


def test_h200_gpu_from_played_back_nvml(host_tree: MakeTree, h200_nvml: PlaybackBackend) -> None:
    nvml = Nvml(h200_nvml).open()
    topo = load_topology(host_tree("h200-vm"), nvml=nvml)
    assert topo.gpu_source == "nvml"
    (gpu,) = topo.gpus
    assert gpu == GpuDevice(
        bus_id="0000:00:06.0",
        index=0,
        name="NVIDIA H200",
        numa_node=None,  # NVML: not supported in this VM; sysfs: -1
        local_cpus=tuple(range(16)),  # NVML's CPU affinity mask 0xffff
        source="nvml",
        persistence_mode=True,
        uuid="GPU-d295b885-cc2a-dd32-b77b-6e0a75708d8f",
        minor=0,
    )
    assert topo.gpu_node == {}


def test_two_socket_server(host_tree: MakeTree) -> None:
    topo = load_topology(host_tree("two-node-gpu"))
    assert topo.nodes == [0, 1]
    assert topo.cpus_of(0) == [0, 1, 2, 3] and topo.cpus_of(1) == [4, 5, 6, 7]
    assert topo.node_distance == {0: (10, 21), 1: (21, 10)}
    assert topo.gpu_node == {"0000:17:00.0": 0, "0000:b1:00.0": 1}
    assert [(g.bus_id, g.minor, g.local_cpus) for g in topo.gpus] == [
        ("0000:17:00.0", 0, (0, 1, 2, 3)),
        ("0000:b1:00.0", 1, (4, 5, 6, 7)),
    ]
    assert topo.devices == (
        HostDevice("nic", "ens1f0", "0000:41:00.0", 0, (0, 1, 2, 3)),
        HostDevice("nvme", "nvme0", "0000:c1:00.0", 1, (4, 5, 6, 7)),
        HostDevice("block", "nvme0n1", "0000:c1:00.0", 1, (4, 5, 6, 7)),  # not nvme0n1p1
    )
    kinds = {i.irq: (i.device_kind, i.node) for i in topo.irqs}
    assert kinds[100] == ("gpu", 0) and kinds[101] == ("gpu", 1)
    assert kinds[111] == ("nic", 0) and kinds[121] == ("nvme", 1)
    assert topo.irq_node == {i: n for i, (_, n) in kinds.items()}
    assert topo.irq(111).name == "mlx5_comp0@pci:0000:41:00.0"  # type: ignore[union-attr]


def test_two_socket_idle_states_with_intel_idle(host_tree: MakeTree) -> None:
    idle = load_topology(host_tree("two-node-gpu")).idle
    assert isinstance(idle, CpuIdle)
    assert (idle.driver, idle.governor, idle.default_idle) == ("intel_idle", "menu", False)
    assert [
        (s.index, s.name, s.exit_latency_us, s.target_residency_us, s.disabled)
        for s in idle.states[5]
    ] == [
        (0, "POLL", 0, 0, False),
        (1, "C1", 2, 2, False),
        (2, "C1E", 10, 20, False),
        (3, "C6", 133, 600, True),
    ]
    assert idle.state(5, 3).desc == "MWAIT 0x20"  # type: ignore[union-attr]


def test_record_round_trips_through_json(host_tree: MakeTree, h200_nvml: PlaybackBackend) -> None:
    for topo in (
        load_topology(host_tree("two-node-gpu")),
        load_topology(host_tree("h200-vm"), nvml=Nvml(h200_nvml).open()),
    ):
        assert Topology.from_record(json.loads(json.dumps(topo.to_record()))) == topo


def test_record_written_before_the_new_fields_still_reads() -> None:
    old = {"cpu_node": {"0": 0, "1": 1}, "irq_node": {"36": 1}, "gpu_node": {}, "override": None}
    topo = Topology.from_record(old)
    assert topo == Topology(cpu_node={0: 0, 1: 1}, irq_node={36: 1})


def test_empty_tree_degrades_to_one_cpu_on_node_0(tmp_path: Path) -> None:
    topo = load_topology(HostPaths.under(tmp_path))
    assert topo.cpu_node == {0: 0}
    assert topo.irqs == () and topo.gpus == () and topo.devices == ()
    assert topo.idle is not None and topo.idle.default_idle


def test_a_recorded_live_tree_reads_as_the_live_host(tmp_path: Path) -> None:
    """record_tree copies every file the readers read (TREE), links included: the copy of
    this host must give this host's topology. IRQ counts move on, so they are left out; other
    developers' tests re-pin IRQs on this shared VM, so the copy is compared with a live
    reading that did not change while it was taken."""

    def still(t: Topology) -> Topology:
        return replace(t, irqs=tuple(replace(i, counts={}) for i in t.irqs), vectors=())

    for attempt in range(5):
        before = still(load_topology(nvml=False))
        tree = tmp_path / str(attempt)
        record_tree(tree, TREE)
        after = still(load_topology(nvml=False))
        if before == after:
            break
    copy = load_topology(HostPaths.under(tree), nvml=False)
    assert still(copy) == after
    assert [v.name for v in copy.vectors] == [v.name for v in load_topology(nvml=False).vectors]


def test_one_pci_function_reads_as_the_whole_bus_reads_it() -> None:
    """pci_device is the one reader of a PCI function's folder (topology and `gpus` use it):
    a node the kernel does not know (-1) is None, and a folder that is not there reads as
    unknown."""
    paths = HostPaths.under(Path(__file__).parents[1] / "fixtures" / "hosts" / "h200-vm")
    whole = read_pci(paths)
    gpu = pci_device(paths.sys / "bus/pci/devices/0000:00:06.0")
    assert gpu == whole["0000:00:06.0"]
    assert gpu.numa_node is None and gpu.local_cpus == tuple(range(16))
    gone = pci_device(paths.sys / "bus/pci/devices/0000:ff:00.0")
    assert (gone.numa_node, gone.local_cpus, gone.irqs) == (None, (), ())
