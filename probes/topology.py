"""The map every attribution needs: which NUMA node each CPU belongs to.

Read from /sys (an injectable root). A topology override file can assign CPUs to emulated
NUMA nodes, for testing cross-NUMA logic on one-node machines; whenever it is in force,
`Topology.override` names it, and every report that uses the topology says so.

Override file (TOML):

    [nodes]            # NUMA node -> CPU list
    0 = "0"
    1 = "1"
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from gpujitter.probes.host import HostPaths, parse_cpulist, read_text

from gpujitter.errors import GpujitterError


@dataclass(frozen=True, slots=True)
class Topology:
    cpu_node: dict[int, int]  # online CPU -> NUMA node
    override: str | None = None  # path of the override file in force, None for the real map

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


def load_override(path: str | Path) -> dict[int, int]:
    """CPU -> node from an override file; GpujitterError with one line on any problem."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except OSError as err:
        raise GpujitterError(f"topology override {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise GpujitterError(f"topology override {path}: {err}") from None
    nodes = data.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        raise GpujitterError(f'topology override {path}: needs a [nodes] table (node = "cpus")')
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
    return cpu_node


def load_topology(paths: HostPaths | None = None, override: str | Path | None = None) -> Topology:
    paths = paths or HostPaths()
    cpu_node = read_cpu_nodes(paths)
    if override is None:
        return Topology(cpu_node=cpu_node)
    emulated = load_override(override)
    missing = sorted(set(cpu_node) - set(emulated))
    if missing:
        raise GpujitterError(
            f"topology override {override}: CPUs {missing} of this node are in no [nodes] entry"
        )
    return Topology(cpu_node={c: emulated[c] for c in cpu_node}, override=str(override))
