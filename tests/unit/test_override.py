"""The topology override file: what a good one does to the map, and the one-line error each
bad one gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujitter.errors import GpujitterError
from gpujitter.probes.topology import Topology, cpu_topology, load_override, load_topology
from tests.unit.conftest import MakeTree

SPLIT_DEV_VM = """
[nodes]
0 = "0"
1 = "1"
[irqs]
36 = 1
"""


def write(tmp_path: Path, text: str, name: str = "override.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_override_emulates_two_nodes_on_the_dev_vm(host_tree: MakeTree, tmp_path: Path) -> None:
    path = write(tmp_path, SPLIT_DEV_VM)
    topo = load_topology(host_tree("dev-vm"), path)
    assert topo.override == str(path)
    assert topo.cpu_node == {0: 0, 1: 1}
    assert topo.irq_node == {36: 1}
    assert topo.irq(36).node == 1  # type: ignore[union-attr]
    assert topo.irq(38).node is None  # type: ignore[union-attr]
    assert topo.node_distance == {}  # emulated nodes have no distances
    record = topo.to_record()
    assert record["override"] == str(path)


def test_override_moves_a_gpu_and_its_local_cpus(host_tree: MakeTree, tmp_path: Path) -> None:
    path = write(
        tmp_path,
        '[nodes]\n0 = "0-5"\n1 = "6,7"\n[gpus]\n"b1:00.0" = 1\n"0000:17:00.0" = 1\n',
    )
    topo = load_topology(host_tree("two-node-gpu"), path)
    assert topo.gpu_node == {"0000:17:00.0": 1, "0000:b1:00.0": 1}
    moved = topo.gpu("0000:17:00.0")
    assert moved is not None and moved.numa_node == 1 and moved.local_cpus == (6, 7)
    # IRQs the file does not name keep their device's real node.
    assert topo.irq_node[100] == 0


def test_override_places_the_gpu_without_a_bus_id(host_tree: MakeTree, tmp_path: Path) -> None:
    # The stub libcuda's (or an NVML-less) GPU has no bus id: its gaps are on GPU -1.
    path = write(tmp_path, SPLIT_DEV_VM + '[gpus]\nunknown = 1\n"00:06.0" = 0\n')
    topo = load_topology(host_tree("dev-vm"), path)
    assert topo.unknown_gpu_node == 1
    assert topo.gpu_node == {"0000:00:06.0": 0}  # "unknown" is no bus id
    assert topo.unknown_gpu_note() == "GPU -1 (no bus id) placed on node 1 by the override"
    assert Topology.from_record(topo.to_record()) == topo
    assert load_topology(host_tree("dev-vm")).unknown_gpu_note() == ""


@pytest.mark.parametrize(
    ("host", "override"), [("dev-vm", None), ("dev-vm", SPLIT_DEV_VM), ("two-node-gpu", None)]
)
def test_the_cpus_nodes_alone_are_the_whole_maps(
    host_tree: MakeTree, tmp_path: Path, host: str, override: str | None
) -> None:
    # What `run` compiles ahead from (cpu_topology) is what the probe set compiles from.
    path = write(tmp_path, override) if override else None
    whole = load_topology(host_tree(host), path, nvml=False)
    assert cpu_topology(host_tree(host), path).cpu_node == whole.cpu_node
    assert len(set(whole.cpu_node.values())) == (1 if host == "dev-vm" and not path else 2)


def test_without_override_nothing_is_emulated(host_tree: MakeTree) -> None:
    assert load_topology(host_tree("dev-vm")).override is None


BAD = [
    ("[nodes\n", "Expected ']'"),
    ('[nodes]\n0 = "0-1"\n[cpus]\n', "unknown table(s) ['cpus']; known: [nodes], [irqs], [gpus]"),
    ("[irqs]\n36 = 1\n", 'needs a [nodes] table (0 = "0-3")'),
    ('[nodes]\n0 = "zero"\n', "bad [nodes] entry 0 = 'zero' (want 0 = \"0-3\")"),
    ("[nodes]\n0 = 1\n", 'bad [nodes] entry 0 = 1 (want 0 = "0-3")'),
    ('[nodes]\nx = "0-1"\n', "bad [nodes] entry x = '0-1'"),
    ('[nodes]\n-1 = "0-1"\n', "bad [nodes] entry -1 = '0-1'"),
    ('[nodes]\n0 = "0-1"\n1 = "1"\n', "CPU 1 is in two nodes"),
    (
        '[nodes]\n0 = "0-1"\n[irqs]\n36 = "one"\n',
        "bad [irqs] entry 36 = 'one' (want a node number)",
    ),
    ('[nodes]\n0 = "0-1"\n[irqs]\n36 = true\n', "bad [irqs] entry 36 = True"),
    ('[nodes]\n0 = "0-1"\n[irqs]\nvirtio = 0\n', "bad [irqs] entry virtio = 0"),
    ('[nodes]\n0 = "0-1"\n[irqs]\n36 = 2\n', "[irqs] 36 = 2, but [nodes] has no node 2"),
    ('[nodes]\n0 = "0-1"\n[gpus]\n"gpu0" = 0\n', "bad [gpus] entry gpu0 = 0"),
    ('gpus = 3\n[nodes]\n0 = "0-1"\n', "[gpus] must be a table"),
    ('[nodes]\n0 = "0-1"\n[gpus]\nunknown = "far"\n', "bad [gpus] entry unknown = 'far'"),
    ('[nodes]\n0 = "0-1"\n[gpus]\nunknown = 1\n', "[gpus] unknown = 1, but [nodes] has no node 1"),
]


@pytest.mark.parametrize(("text", "said"), BAD)
def test_bad_override_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(GpujitterError) as err:
        load_override(path)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"topology override {path}: ")
    assert said in message


def test_override_missing_a_cpu_of_this_host(host_tree: MakeTree, tmp_path: Path) -> None:
    path = write(tmp_path, '[nodes]\n0 = "0"\n')
    with pytest.raises(GpujitterError, match=r"CPUs \[1\] of this node are in no \[nodes\] entry"):
        load_topology(host_tree("dev-vm"), path)


def test_override_file_missing_or_binary(tmp_path: Path) -> None:
    with pytest.raises(GpujitterError, match="No such file or directory"):
        load_override(tmp_path / "absent.toml")
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(GpujitterError, match="not UTF-8 text"):
        load_override(binary)
