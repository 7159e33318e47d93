"""The map every attribution needs: which NUMA node each CPU, IRQ, GPU and I/O device belongs
to, the idle states each CPU can enter, and how the IRQs are spread.

Read from /proc and /sys (an injectable HostPaths), GPUs from NVML when it answers and from
PCI sysfs otherwise. A topology override file can assign CPUs (and IRQs, GPUs) to emulated
NUMA nodes, for testing cross-NUMA logic on one-node machines; whenever it is in force,
`Topology.override` names it, and every report that uses the topology says so.

Override file (TOML, docs/topology.md):

    [nodes]            # NUMA node -> CPU list (required; must cover every online CPU)
    0 = "0"
    1 = "1"
    [irqs]             # IRQ number -> NUMA node of its device (optional)
    36 = 1
    [gpus]             # GPU PCI bus id -> NUMA node (optional)
    "0000:00:06.0" = 0
    unknown = 0        # the GPU with no bus id (no NVML: its gaps are on GPU -1)
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from gpujitter.errors import GpujitterError
from gpujitter.probes.events import typed
from gpujitter.probes.host import (
    HostPaths,
    cpus_in,
    decimal,
    numa_node,
    parse_cpulist,
    pci_address_of,
    read_cpulist,
    read_int,
    read_text,
)
from gpujitter.probes.interrupts import read_table
from gpujitter.probes.nvml import Nvml, NvmlUnavailable, open_nvml
from gpujitter.tomlfile import load_toml

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0302", "0x0300")  # 3D controller, VGA controller
# The [gpus] key that places the GPU nothing gives a bus id: the stub libcuda's, or any
# GPU when NVML does not answer, whose gaps land on GPU -1.
UNKNOWN_GPU_KEY = "unknown"
MAX_NODE = 1 << 10  # the kernel's MAX_NUMNODES at its largest (NODES_SHIFT 10)
DeviceKind = Literal["gpu", "nic", "nvme", "block", ""]

# Without a cpuidle driver the kernel idles through the architecture's default idle routine
# (HLT on x86) and still traces power:cpu_idle, with state 1; with idle=poll it spins, state 0.
DEFAULT_IDLE_STATE = 1
POLL_IDLE_STATE = 0

# Every file the readers below look at, as record_tree patterns (tests/fixtures/hosts/).
TREE = (
    "proc/cmdline",
    "proc/interrupts",
    "proc/irq/*/{smp_affinity_list,effective_affinity_list}",
    "proc/driver/nvidia/gpus/*/information",
    "sys/devices/system/cpu/online",
    "sys/devices/system/node/node*/{cpulist,distance}",
    "sys/devices/system/cpu/cpuidle/{current_driver,current_governor,current_governor_ro}",
    "sys/devices/system/cpu/cpu*/cpuidle/state*/{name,desc,latency,residency,disable}",
    "sys/bus/pci/devices/*/{class,vendor,device,numa_node,local_cpulist,irq}",
    "sys/bus/pci/devices/*/msi_irqs/*",
    "sys/class/{net,nvme,block}/*/device",
    "sys/class/block/*/dev",
    "sys/kernel/irq/*/{actions,chip_name,hwirq}",
)


@dataclass(frozen=True, slots=True)
class IdleState:
    """One idle state a CPU can enter; `index` is the state power:cpu_idle reports."""

    index: int
    name: str
    desc: str
    exit_latency_us: int | None  # None: the kernel does not know (default idle, no driver)
    target_residency_us: int | None
    disabled: bool = False

    @property
    def exit_latency_ns(self) -> int:
        """The exit latency as events carry it: -1 when the kernel does not publish one."""
        return -1 if self.exit_latency_us is None else self.exit_latency_us * 1000


@dataclass(frozen=True, slots=True)
class CpuIdle:
    """The cpuidle framework's view. driver None means no cpuidle driver is registered
    (sysfs says "none"): every CPU idles in the kernel's default idle state, which this model
    lists as the one state of each CPU so that traced state numbers still resolve."""

    driver: str | None
    governor: str | None
    states: dict[int, tuple[IdleState, ...]]  # CPU -> its states, in index order
    default_idle: bool = False  # True when the states are the kernel's fallback, not cpuidle's

    def state(self, cpu: int, index: int) -> IdleState | None:
        """The state power:cpu_idle names by `index` on `cpu`, None when unknown."""
        for st in self.states.get(cpu, ()):
            if st.index == index:
                return st
        return None


@dataclass(frozen=True, slots=True)
class GpuDevice:
    bus_id: str  # sysfs form, 0000:00:06.0
    index: int | None  # NVML index; None when NVML did not answer
    name: str
    numa_node: int | None  # None: unknown (sysfs -1, NVML not supported)
    local_cpus: tuple[int, ...]
    source: Literal["nvml", "sysfs"]
    persistence_mode: bool | None = None  # None when NVML cannot say
    uuid: str = ""
    minor: int | None = None  # N of /dev/nvidiaN, from /proc/driver/nvidia; None when unknown


@dataclass(frozen=True, slots=True)
class HostDevice:
    """A physical NIC, NVMe controller or block device and where it is attached."""

    kind: Literal["nic", "nvme", "block"]
    name: str  # eth0, nvme0, vda
    bus_id: str | None  # PCI address; None when not on PCI
    numa_node: int | None
    local_cpus: tuple[int, ...]
    dev: str = ""  # block devices: MAJ:MIN, as block tracepoints name them


@dataclass(frozen=True, slots=True)
class IrqInfo:
    irq: int
    name: str  # the handlers' names (actions), comma-separated when shared
    chip: str
    hwirq: str
    device: str | None  # PCI address of the device raising it, when known
    device_kind: DeviceKind
    counts: dict[int, int]  # CPU -> interrupts handled there since boot
    affinity: tuple[int, ...]  # smp_affinity_list: CPUs it may be sent to
    effective_affinity: tuple[int, ...]  # CPUs it is really sent to
    node: int | None  # its device's NUMA node; None when unknown

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True, slots=True)
class IrqVector:
    """A named architecture vector of /proc/interrupts (LOC, RES, CAL, TLB, ...)."""

    name: str
    desc: str
    counts: dict[int, int]  # CPU -> count; {} for totals-only rows (ERR, MIS)
    total: int


@dataclass(frozen=True, slots=True)
class Topology:
    cpu_node: dict[int, int]  # online CPU -> NUMA node
    irq_node: dict[int, int] = field(default_factory=dict)  # IRQ -> its device's node, if known
    gpu_node: dict[str, int] = field(default_factory=dict)  # GPU PCI bus id -> node, if known
    override: str | None = None  # path of the override file in force, None for the real map
    unknown_gpu_node: int | None = None  # GPU -1's node: only an override's `unknown` says it
    node_distance: dict[int, tuple[int, ...]] = field(default_factory=dict)  # real nodes only
    idle: CpuIdle | None = None
    gpus: tuple[GpuDevice, ...] = ()
    gpu_source: str = ""  # "nvml" or "sysfs (why NVML was not used)"
    devices: tuple[HostDevice, ...] = ()
    irqs: tuple[IrqInfo, ...] = ()
    vectors: tuple[IrqVector, ...] = ()

    def to_record(self) -> dict[str, Any]:
        """Plain data for trace headers and JSON (keys as strings, as JSON needs)."""
        return {
            "cpu_node": _str_keys(self.cpu_node),
            "irq_node": _str_keys(self.irq_node),
            "gpu_node": dict(sorted(self.gpu_node.items())),
            "override": self.override,
            "unknown_gpu_node": self.unknown_gpu_node,
            "node_distance": {str(n): list(d) for n, d in sorted(self.node_distance.items())},
            "idle": None if self.idle is None else _idle_record(self.idle),
            "gpus": [_plain(g) for g in self.gpus],
            "gpu_source": self.gpu_source,
            "devices": [_plain(d) for d in self.devices],
            "irqs": [{**_plain(i), "counts": _str_keys(i.counts)} for i in self.irqs],
            "vectors": [{**_plain(v), "counts": _str_keys(v.counts)} for v in self.vectors],
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Topology:
        """Inverse of to_record, every field checked against its annotation (BadRecord names
        the one that is not); records written before a field existed lack it."""
        return typed(cls, rec, "topology")

    @property
    def cpus(self) -> list[int]:
        return sorted(self.cpu_node)

    @property
    def nodes(self) -> list[int]:
        return sorted(set(self.cpu_node.values()))

    def node_of(self, cpu: int) -> int:
        return self.cpu_node.get(cpu, 0)

    def cpus_of(self, node: int) -> list[int]:
        return sorted(c for c, n in self.cpu_node.items() if n == node)

    def irq(self, number: int) -> IrqInfo | None:
        return next((i for i in self.irqs if i.irq == number), None)

    def gpu(self, bus_id: str) -> GpuDevice | None:
        return next((g for g in self.gpus if g.bus_id == bus_id), None)

    def unknown_gpu_note(self) -> str:
        """What every view of the topology adds when the override placed GPU -1; "" else."""
        if self.unknown_gpu_node is None:
            return ""
        return f"GPU -1 (no bus id) placed on node {self.unknown_gpu_node} by the override"


def _plain(obj: Any) -> dict[str, Any]:
    return {name: getattr(obj, name) for name in obj.__slots__}


def _str_keys(mapping: dict[int, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in sorted(mapping.items())}


def _idle_record(idle: CpuIdle) -> dict[str, Any]:
    return {
        "driver": idle.driver,
        "governor": idle.governor,
        "default_idle": idle.default_idle,
        "states": {str(c): [_plain(s) for s in sts] for c, sts in sorted(idle.states.items())},
    }


# ---------------------------------------------------------------------------------------
# Readers. Each takes HostPaths and returns what it found; absent files mean "not known".


def read_cpu_nodes(paths: HostPaths) -> dict[int, int]:
    """Online CPUs and their node; every CPU on node 0 when the kernel has no NUMA info."""
    online = cpus_in(read_text(paths.sys / "devices/system/cpu/online") or "0") or (0,)
    cpu_node = dict.fromkeys(online, 0)
    for node, node_dir in _node_dirs(paths):
        for cpu in read_cpulist(node_dir / "cpulist"):
            if cpu in cpu_node:
                cpu_node[cpu] = node
    return cpu_node


def _node_dirs(paths: HostPaths) -> list[tuple[int, Path]]:
    root = paths.sys / "devices/system/node"
    found = [(int(d.name[4:]), d) for d in root.glob("node[0-9]*") if d.name[4:].isdecimal()]
    return sorted(found)


def read_node_distance(paths: HostPaths) -> dict[int, tuple[int, ...]]:
    """Node -> its SLIT distances to nodes 0..N (10 = local); a node whose file does not
    read as numbers has none (unknown, as without the file)."""
    out = {}
    for node, node_dir in _node_dirs(paths):
        values = [decimal(d) for d in (read_text(node_dir / "distance") or "").split()]
        if values and None not in values:
            out[node] = tuple(v for v in values if v is not None)
    return out


def read_cpu_idle(paths: HostPaths, cpus: list[int]) -> CpuIdle:
    base = paths.sys / "devices/system/cpu"
    driver = read_text(base / "cpuidle/current_driver")
    governor = read_text(base / "cpuidle/current_governor") or read_text(
        base / "cpuidle/current_governor_ro"
    )
    states = {cpu: cpuidle_states(base / f"cpu{cpu}/cpuidle") for cpu in cpus}
    if driver not in (None, "", "none") and any(states.values()):
        return CpuIdle(driver=driver, governor=governor, states=states)
    fallback = _default_idle_state(paths)
    return CpuIdle(
        driver=None,
        governor=governor,
        states=dict.fromkeys(cpus, (fallback,)),
        default_idle=True,
    )


def cpuidle_states(cpuidle: Path) -> tuple[IdleState, ...]:
    """One CPU's idle states from its cpuidle directory, in index order; () without a driver."""
    return tuple(
        IdleState(
            index=index,
            name=read_text(state_dir / "name") or state_dir.name,
            desc=read_text(state_dir / "desc") or "",
            exit_latency_us=read_int(state_dir / "latency"),
            target_residency_us=read_int(state_dir / "residency"),
            disabled=bool(read_int(state_dir / "disable")),
        )
        for index, state_dir in _numbered(cpuidle, "state")
    )


def _numbered(folder: Path, prefix: str) -> list[tuple[int, Path]]:
    """The entries of a sysfs folder named prefix + a number (state0, an MSI vector's 24)
    with their numbers, in their order: a glob's [0-9]* also takes state1x or 2², which
    int() refuses."""
    found = ((decimal(d.name[len(prefix) :]), d) for d in folder.glob(f"{prefix}[0-9]*"))
    return sorted((n, d) for n, d in found if n is not None)


def idle_residency_ns(cpuidle: Path) -> dict[str, int]:
    """Time one CPU has spent in each of its idle states since boot (the states' `time`
    files, in µs), by state name in index order; {} without a driver."""
    dirs = [state_dir for _, state_dir in _numbered(cpuidle, "state")]
    out = {}
    for state_dir in dirs:
        name, usec = read_text(state_dir / "name"), decimal(read_text(state_dir / "time") or "")
        if name and usec is not None:
            out[name] = usec * 1000
    return out


def _default_idle_state(paths: HostPaths) -> IdleState:
    """The state a CPU without a cpuidle driver idles in: the kernel's default idle routine
    (HLT on x86), whose wake-up latency the kernel does not know; `idle=poll` spins instead."""
    args = (read_text(paths.proc / "cmdline") or "").split()
    if "idle=poll" in args:
        return IdleState(
            index=POLL_IDLE_STATE,
            name="POLL",
            desc="idle=poll: the CPU spins, no cpuidle driver",
            exit_latency_us=0,
            target_residency_us=0,
        )
    return IdleState(
        index=DEFAULT_IDLE_STATE,
        name="HLT",
        desc="default idle (no cpuidle driver): arch_cpu_idle, HLT on x86",
        exit_latency_us=None,
        target_residency_us=None,
    )


@dataclass(frozen=True, slots=True)
class PciDevice:
    bus_id: str
    pci_class: str
    vendor: str
    device: str
    numa_node: int | None
    local_cpus: tuple[int, ...]
    irqs: tuple[int, ...]  # MSI/MSI-X vectors, or the legacy INTx line when it has none


def read_pci(paths: HostPaths) -> dict[str, PciDevice]:
    return {dev.name: pci_device(dev) for dev in sorted((paths.sys / "bus/pci/devices").glob("*"))}


def pci_device(dev: Path) -> PciDevice:
    """One PCI function from its sysfs folder (bus/pci/devices/BUS); a missing file reads as
    unknown."""
    msi = dev / "msi_irqs"
    irqs = [n for n, _ in _numbered(msi, "")] if msi.is_dir() else []
    if not irqs and (read_int(dev / "irq") or 0) > 0:
        irqs = [read_int(dev / "irq") or 0]
    return PciDevice(
        bus_id=dev.name,
        pci_class=read_text(dev / "class") or "",
        vendor=read_text(dev / "vendor") or "",
        device=read_text(dev / "device") or "",
        numa_node=numa_node(read_text(dev / "numa_node")),
        local_cpus=read_cpulist(dev / "local_cpulist"),
        irqs=tuple(irqs),
    )


def read_gpus_sysfs(paths: HostPaths, pci: dict[str, PciDevice]) -> list[GpuDevice]:
    """NVIDIA display/3D controllers on PCI, named by the driver's /proc file when present."""
    gpus = []
    for p in pci.values():
        if p.vendor != NVIDIA_VENDOR or not p.pci_class.startswith(GPU_CLASSES):
            continue
        info = _nvidia_proc_info(paths, p.bus_id)
        minor = info.get("Device Minor", "")
        gpus.append(
            GpuDevice(
                bus_id=p.bus_id,
                index=None,
                name=info.get("Model", f"NVIDIA {p.device}"),
                numa_node=p.numa_node,
                local_cpus=p.local_cpus,
                source="sysfs",
                minor=int(minor) if minor.isdigit() else None,
            )
        )
    return gpus


def _nvidia_proc_info(paths: HostPaths, bus_id: str) -> dict[str, str]:
    text = read_text(paths.proc / "driver/nvidia/gpus" / bus_id / "information") or ""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def read_gpus(
    paths: HostPaths, pci: dict[str, PciDevice], cpu_count: int, nvml: Nvml | bool | None
) -> tuple[list[GpuDevice], str]:
    """GPUs from NVML when it answers (its NUMA node and CPU affinity, sysfs filling what it
    does not know), else from sysfs; and a line saying which source was used and why."""
    sysfs = read_gpus_sysfs(paths, pci)
    if nvml is False:
        return sysfs, "sysfs (NVML not asked)"
    if nvml is None and not paths.live:
        return sysfs, "sysfs (a recorded tree: NVML not asked)"
    session: Nvml | None = nvml if isinstance(nvml, Nvml) else None
    try:
        if session is None:
            session = open_nvml()
    except NvmlUnavailable as err:
        return sysfs, f"sysfs (NVML unavailable: {err})"
    except ImportError:
        return sysfs, "sysfs (NVML unavailable: pynvml is not installed)"
    try:
        found = session.gpus(cpu_count)
    finally:
        if not isinstance(nvml, Nvml):
            session.close()
    by_bus = {g.bus_id: g for g in sysfs}
    gpus = []
    for info in found:
        fallback = by_bus.pop(info.pci_bus_id, None)
        gpus.append(
            GpuDevice(
                bus_id=info.pci_bus_id,
                index=info.index,
                name=info.name,
                numa_node=info.numa_node
                if info.numa_node is not None
                else (fallback.numa_node if fallback else None),
                local_cpus=info.local_cpus or (fallback.local_cpus if fallback else ()),
                source="nvml",
                persistence_mode=info.persistence_mode,
                uuid=info.uuid,
                minor=fallback.minor if fallback else None,
            )
        )
    return gpus + list(by_bus.values()), "nvml"


def read_devices(paths: HostPaths, pci: dict[str, PciDevice]) -> list[HostDevice]:
    """Physical NICs, NVMe controllers and whole block devices: those with a `device` link
    (virtual NICs, partitions, loop, zram and dm devices have none)."""
    found: list[HostDevice] = []
    sources: tuple[tuple[Literal["nic", "nvme", "block"], str], ...] = (
        ("nic", "class/net"),
        ("nvme", "class/nvme"),
        ("block", "class/block"),
    )
    for kind, where in sources:
        for entry in sorted((paths.sys / where).glob("*")):
            link = entry / "device"
            if not link.exists():  # virtual devices and partitions have no device link
                continue
            bus_id = pci_address_of(link)
            p = pci.get(bus_id) if bus_id else None
            found.append(
                HostDevice(
                    kind=kind,
                    name=entry.name,
                    bus_id=bus_id,
                    numa_node=p.numa_node if p else None,
                    local_cpus=p.local_cpus if p else (),
                    dev=(read_text(entry / "dev") or "").strip() if kind == "block" else "",
                )
            )
    return found


def read_irqs(
    paths: HostPaths,
    pci: dict[str, PciDevice],
    kinds: dict[str, DeviceKind],
) -> tuple[list[IrqInfo], list[IrqVector]]:
    """Numbered IRQs with their device, chip, affinity and counts (sysfs first, the
    /proc/interrupts row where sysfs lacks it), and the named vectors."""
    table = read_table(paths)
    vectors = [
        IrqVector(r.label, " ".join(r.words), r.per_cpu, r.total)
        for r in table.values()
        if not r.numbered
    ]
    owner = {irq: p.bus_id for p in pci.values() for irq in p.irqs}
    irqs = []
    for row in sorted((r for r in table.values() if r.numbered), key=lambda r: int(r.label)):
        irq = int(row.label)
        sysirq = paths.sys / "kernel/irq" / str(irq)
        fallback = row.words
        chip = read_text(sysirq / "chip_name") or (fallback[0] if fallback else "")
        device = owner.get(irq) or _pci_in_chip_name(chip)
        p = pci.get(device) if device else None
        irqs.append(
            IrqInfo(
                irq=irq,
                name=read_text(sysirq / "actions") or row.name,
                chip=chip,
                hwirq=read_text(sysirq / "hwirq") or (fallback[1] if len(fallback) > 1 else ""),
                device=device,
                device_kind=kinds.get(device, "") if device else "",
                counts=row.per_cpu,
                affinity=read_cpulist(paths.proc / "irq" / str(irq) / "smp_affinity_list"),
                effective_affinity=read_cpulist(
                    paths.proc / "irq" / str(irq) / "effective_affinity_list"
                ),
                node=p.numa_node if p else None,
            )
        )
    return irqs, vectors


def _pci_in_chip_name(chip: str) -> str | None:
    """MSI chips are named after their device on current kernels: 'PCI-MSIX-0000:00:01.0'."""
    tail = chip.rsplit("-", 1)[-1] if chip.startswith(("PCI-MSI", "IR-PCI-MSI")) else ""
    return tail if tail.count(":") == 2 else None


# ---------------------------------------------------------------------------------------
# The override file.


@dataclass(frozen=True, slots=True)
class Override:
    cpu_node: dict[int, int]
    irq_node: dict[int, int]
    gpu_node: dict[str, int]
    unknown_gpu_node: int | None = None


def load_override(path: str | Path) -> Override:
    """The override file's maps; GpujitterError with one line on any problem."""
    path = Path(path)
    data = load_toml(path, "topology override")
    unknown = set(data) - {"nodes", "irqs", "gpus"}
    if unknown:
        raise GpujitterError(
            f"topology override {path}: unknown table(s) {sorted(unknown)}; "
            "known: [nodes], [irqs], [gpus]"
        )
    nodes = data.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        raise GpujitterError(f'topology override {path}: needs a [nodes] table (0 = "0-3")')
    cpu_node: dict[int, int] = {}
    for node, cpus in nodes.items():
        try:
            node_id = int(node)
            cpu_list = parse_cpulist(cpus) if isinstance(cpus, str) else []
        except ValueError:
            node_id, cpu_list = -1, []
        if not 0 <= node_id < MAX_NODE or not cpu_list:
            raise GpujitterError(
                f'topology override {path}: bad [nodes] entry {node} = {cpus!r} (want 0 = "0-3")'
            )
        for cpu in cpu_list:
            if cpu in cpu_node:
                raise GpujitterError(f"topology override {path}: CPU {cpu} is in two nodes")
            cpu_node[cpu] = node_id
    defined = set(cpu_node.values())
    gpu_node = _node_map(path, "gpus", data.get("gpus", {}), _gpu_key, defined)
    return Override(
        cpu_node=cpu_node,
        irq_node=_node_map(path, "irqs", data.get("irqs", {}), int, defined),
        unknown_gpu_node=gpu_node.pop(UNKNOWN_GPU_KEY, None),
        gpu_node=gpu_node,
    )


def _gpu_key(text: str) -> str:
    return UNKNOWN_GPU_KEY if text.strip().lower() == UNKNOWN_GPU_KEY else _bus_id(text)


def _bus_id(text: str) -> str:
    bus = text.strip().lower()
    if bus.count(":") == 1:  # 00:06.0, as lspci prints it
        bus = "0000:" + bus
    if bus.count(":") != 2 or "." not in bus:
        raise ValueError(text)
    return bus


def _node_map(path: Path, table: str, items: Any, key: Any, defined: set[int]) -> dict[Any, int]:
    if not isinstance(items, dict):
        raise GpujitterError(f"topology override {path}: [{table}] must be a table")
    out = {}
    for k, v in items.items():
        try:
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(v)
            name = key(k)
            if isinstance(name, int) and not 0 <= name < 1 << 32:  # an IRQ number
                raise ValueError(k)
            out[name] = v
        except ValueError:
            raise GpujitterError(
                f"topology override {path}: bad [{table}] entry {k} = {v!r} (want a node number)"
            ) from None
        if v not in defined:
            raise GpujitterError(
                f"topology override {path}: [{table}] {k} = {v}, but [nodes] has no node {v}"
            )
    return out


def check_override(path: str | Path, cpus: Iterable[int]) -> Override:
    """The override file's maps, where they place every one of this node's `cpus`;
    GpujitterError with one line otherwise (`run --print-config` checks it as the start does)."""
    emulated = load_override(path)
    missing = sorted(set(cpus) - set(emulated.cpu_node))
    if missing:
        raise GpujitterError(
            f"topology override {os.fspath(path)}: CPUs {missing} of this node are in no "
            "[nodes] entry"
        )
    return emulated


def apply_override(real: Topology, emulated: Override, source: str) -> Topology:
    """The real topology seen through the override (check_override's: it places every CPU):
    CPUs on their emulated nodes, IRQs and GPUs on the nodes the file names (their real node
    otherwise). Node distances are dropped: emulated nodes have none."""
    cpu_node = {c: emulated.cpu_node[c] for c in real.cpu_node}
    irq_node = {**real.irq_node, **emulated.irq_node}
    gpu_node = {**real.gpu_node, **emulated.gpu_node}

    def cpus_of(node: int | None) -> tuple[int, ...]:
        return tuple(sorted(c for c, n in cpu_node.items() if n == node))

    gpus = tuple(
        replace(g, numa_node=gpu_node[g.bus_id], local_cpus=cpus_of(gpu_node[g.bus_id]))
        if g.bus_id in emulated.gpu_node
        else g
        for g in real.gpus
    )
    irqs = tuple(
        replace(i, node=emulated.irq_node[i.irq]) if i.irq in emulated.irq_node else i
        for i in real.irqs
    )
    return replace(
        real,
        cpu_node=cpu_node,
        irq_node=irq_node,
        gpu_node=gpu_node,
        override=source,
        unknown_gpu_node=emulated.unknown_gpu_node,
        node_distance={},
        gpus=gpus,
        irqs=irqs,
    )


def cpu_topology(paths: HostPaths | None = None, override: str | Path | None = None) -> Topology:
    """The CPUs' nodes alone (the override's where one is given): what the probes' compile
    needs of the topology, without the devices, IRQs and GPUs (NVML) that load_topology
    reads. GpujitterError for a bad override, as load_topology."""
    real = Topology(cpu_node=read_cpu_nodes(paths or HostPaths()))
    if override is None:
        return real
    return apply_override(real, check_override(override, real.cpu_node), os.fspath(override))


def load_topology(
    paths: HostPaths | None = None,
    override: str | Path | None = None,
    *,
    nvml: Nvml | bool | None = None,
) -> Topology:
    """Read the whole topology. nvml: None asks NVML on a live host only, False never, an
    open session is used (and left open)."""
    paths = paths or HostPaths()
    cpu_node = read_cpu_nodes(paths)
    pci = read_pci(paths)
    gpus, gpu_source = read_gpus(paths, pci, max(cpu_node, default=0) + 1, nvml)
    devices = read_devices(paths, pci)
    # A PCI function can back several entries (nvme0 and its nvme0n1): the most specific
    # kind names its IRQs.
    rank = {"block": 0, "nic": 1, "nvme": 2}
    kinds: dict[str, DeviceKind] = {
        d.bus_id: d.kind for d in sorted(devices, key=lambda d: rank[d.kind]) if d.bus_id
    }
    kinds.update({g.bus_id: "gpu" for g in gpus})
    irqs, vectors = read_irqs(paths, pci, kinds)
    real = Topology(
        cpu_node=cpu_node,
        irq_node={i.irq: i.node for i in irqs if i.node is not None},
        gpu_node={g.bus_id: g.numa_node for g in gpus if g.numa_node is not None},
        node_distance=read_node_distance(paths),
        idle=read_cpu_idle(paths, sorted(cpu_node)),
        gpus=tuple(gpus),
        gpu_source=gpu_source,
        devices=tuple(devices),
        irqs=tuple(irqs),
        vectors=tuple(vectors),
    )
    if override is None:
        return real
    return apply_override(real, check_override(override, cpu_node), os.fspath(override))
