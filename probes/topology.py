"""The map every attribution needs: which NUMA node each CPU, IRQ and GPU belongs to.

Read from /sys (an injectable root). A topology override file can assign CPUs (and devices)
to emulated NUMA nodes, for testing cross-NUMA logic on one-node machines; whenever it is in
force, `Topology.override` names it, and every report that uses the topology says so.

Override file (TOML):

    [nodes]            # NUMA node -> CPU list (required; must cover every online CPU)
    0 = "0"
    1 = "1"
    [irqs]             # IRQ number -> NUMA node of its device (optional)
    36 = 1
    [gpus]             # GPU PCI bus id -> NUMA node (optional)
    "0000:00:06.0" = 0
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpujitter.errors import GpujitterError
from gpujitter.probes.host import HostPaths, parse_cpulist, read_text


@dataclass(frozen=True, slots=True)
class Topology:
    cpu_node: dict[int, int]  # online CPU -> NUMA node
    irq_node: dict[int, int] = field(default_factory=dict)  # IRQ -> its device's node, if known
    gpu_node: dict[str, int] = field(default_factory=dict)  # GPU PCI bus id -> node, if known
    override: str | None = None  # path of the override file in force, None for the real map

    def to_record(self) -> dict[str, Any]:
        """Plain data for trace headers and JSON (keys as strings, as JSON needs)."""
        return {
            "cpu_node": {str(c): n for c, n in sorted(self.cpu_node.items())},
            "irq_node": {str(i): n for i, n in sorted(self.irq_node.items())},
            "gpu_node": dict(sorted(self.gpu_node.items())),
            "override": self.override,
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Topology:
        return cls(
            cpu_node={int(c): int(n) for c, n in rec["cpu_node"].items()},
            irq_node={int(i): int(n) for i, n in rec.get("irq_node", {}).items()},
            gpu_node={str(b): int(n) for b, n in rec.get("gpu_node", {}).items()},
            override=rec.get("override"),
        )

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


def read_cpu_nodes(paths: HostPaths) -> dict[int, int]:
    """Online CPUs and their node; every CPU on node 0 when the kernel has no NUMA info."""
    online = parse_cpulist(read_text(paths.sys / "devices/system/cpu/online") or "0")
    cpu_node = dict.fromkeys(online, 0)
    node_root = paths.sys / "devices/system/node"
    for node_dir in sorted(node_root.glob("node[0-9]*")):
        node = int(node_dir.name[4:])
        for cpu in parse_cpulist(read_text(node_dir / "cpulist") or ""):
            if cpu in cpu_node:
                cpu_node[cpu] = node
    return cpu_node


@dataclass(frozen=True, slots=True)
class Override:
    cpu_node: dict[int, int]
    irq_node: dict[int, int]
    gpu_node: dict[str, int]


def load_override(path: str | Path) -> Override:
    """The override file's maps; GpujitterError with one line on any problem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise GpujitterError(f"topology override {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise GpujitterError(f"topology override {path}: {err}") from None
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
            cpu_list = parse_cpulist(str(cpus))
        except ValueError:
            raise GpujitterError(
                f'topology override {path}: bad entry {node} = {cpus!r} (want 0 = "0-3")'
            ) from None
        for cpu in cpu_list:
            if cpu in cpu_node:
                raise GpujitterError(f"topology override {path}: CPU {cpu} is in two nodes")
            cpu_node[cpu] = node_id
    return Override(
        cpu_node=cpu_node,
        irq_node=_int_map(path, "irqs", data.get("irqs", {}), key=int),
        gpu_node=_int_map(path, "gpus", data.get("gpus", {}), key=str),
    )


def _int_map(path: Path, table: str, items: Any, key: Any) -> dict[Any, int]:
    if not isinstance(items, dict):
        raise GpujitterError(f"topology override {path}: [{table}] must be a table")
    out = {}
    for k, v in items.items():
        try:
            out[key(k)] = int(v)
        except (TypeError, ValueError):
            raise GpujitterError(
                f"topology override {path}: bad [{table}] entry {k} = {v!r} (want a node number)"
            ) from None
    return out


def load_topology(paths: HostPaths | None = None, override: str | Path | None = None) -> Topology:
    paths = paths or HostPaths()
    real = Topology(cpu_node=read_cpu_nodes(paths))
    if override is None:
        return real
    emulated = load_override(override)
    missing = sorted(set(real.cpu_node) - set(emulated.cpu_node))
    if missing:
        raise GpujitterError(
            f"topology override {override}: CPUs {missing} of this node are in no [nodes] entry"
        )
    return replace(
        real,
        cpu_node={c: emulated.cpu_node[c] for c in real.cpu_node},
        irq_node={**real.irq_node, **emulated.irq_node},
        gpu_node={**real.gpu_node, **emulated.gpu_node},
        override=str(override),
    )
