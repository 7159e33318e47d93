"""A minute of an eight-GPU node as the TUI receives it (tests/tui/engine_stream.py): one
feeding loop per GPU on a two-node machine whose GPUs all sit on node 0, with stalls spread
so that every cause shows on some GPU's timeline and one GPU stays clean."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from gpujitter.probes.events import ProbeStatus
from gpujitter.probes.nvml import GpuInfo
from tests.fixtures.streams.synthetic import T0, TWO_NODES
from tests.tui.engine_stream import Node, idle_halves, ndjson
from tests.tui.engine_stream import stream as engine_stream

GPUS = 8
BUS = [f"0000:{0x18 + 0x20 * k:02x}:00.0" for k in range(GPUS)]
TOPOLOGY = dataclasses.replace(TWO_NODES, gpu_node={bus: 0 for bus in BUS})
PLAN = {
    0: [(6.0, "swap", 30), (33.0, "malloc", 60), (51.0, "irq", 20)],
    1: [(12.5, "contention", 18), (41.5, "swap", 25)],
    2: [(19.0, "migrate", 40), (48.0, "cstate", 12)],
    3: [(27.0, "faults", 22)],
    4: [(9.5, "compute", 15), (36.0, "contention", 35), (55.0, "malloc", 20)],
    5: [],
    6: [(23.0, "irq", 30), (44.0, "loader", 28)],
    7: [(15.0, "cstate", 10), (30.0, "swap", 45), (58.0, "contention", 16)],
}
NODE = Node(
    host="gpu-node-8x",
    topology=TOPOLOGY,
    gpus=tuple(
        GpuInfo(k, "NVIDIA H200", f"GPU-{k:08d}", BUS[k], 0, (0, 1), True) for k in range(GPUS)
    ),
    plan=PLAN,
    probes=tuple(
        ProbeStatus(ts_ns=T0, probe=p, state="running")
        for p in ("sched", "irq", "faults", "cstate", "malloc", "cuda", "nvml")
    ),
    reports=idle_halves(TOPOLOGY),
)


@functools.cache
def _built() -> bytes:
    return ndjson(engine_stream(NODE))


def write(path: Path) -> Path:
    """hello, snapshot and the minute's records, in the order a client receives them, as a
    replay reads them (the engine runs once a session: its output is deterministic)."""
    path.write_bytes(_built())
    return path
