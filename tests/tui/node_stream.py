"""A minute of a two-GPU, two-node training node as the daemon's socket streams it
(docs/schema.md "Socket messages"): the TUI's fixed test data and the replay demo.

Built the one way TUI fixtures are (tests/tui/engine_stream.py): each GPU's feeding loop on
its own node's CPUs, with stalls of several kinds; the gaps' causes, shares, evidence and
remedies are the engine's. The processes, threads and IRQ carry names that may be hostile
("markup": Textual markup and actions; "control": terminal control sequences and bytes that
were not UTF-8; "long": far wider than a terminal), so that every view's sanitising and
cutting of what the daemon relays stays exercised. Deterministic:
`python -m tests.tui.node_stream` rewrites tests/fixtures/tui/node-stream.ndjson, and a test
checks the committed file is what this produces.
"""

from __future__ import annotations

import functools
import random
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpujitter.probes.events import CpuStats, ProbeStatus
from gpujitter.probes.nvml import GpuInfo
from gpujitter.probes.topology import Topology
from tests.fixtures.streams.feeding import LOADER, SEC, TGID, TID
from tests.fixtures.streams.synthetic import MS, T0
from tests.tui.engine_stream import (
    MINUTE_S,
    PID_STEP,
    REALTIME_NS,
    Node,
    Placement,
    Timed,
    copy_of,
    each_second,
    ndjson,
)
from tests.tui.engine_stream import stream as engine_stream

NDJSON = Path(__file__).parents[1] / "fixtures/tui/node-stream.ndjson"

US = 1_000
NVME_IRQ = 36
BUS = ("0000:17:00.0", "0000:b1:00.0")
TOPOLOGY = Topology(
    cpu_node={c: 0 if c < 4 else 1 for c in range(8)},
    irq_node={NVME_IRQ: 1, 40: 0},
    gpu_node={BUS[0]: 0, BUS[1]: 1},
)
GPUS = (
    GpuInfo(0, "NVIDIA H200", "GPU-8d3c3f4a", BUS[0], 0, (0, 1, 2, 3), True),
    GpuInfo(1, "NVIDIA H200", "GPU-1f0b77c2", BUS[1], 1, (4, 5, 6, 7), True),
)
# The loop's CPUs on this node: GPU 0's feeding thread runs on its GPU's node; GPU 1's rank
# was started on the wrong node: its threads run on node 0, where the NVMe's interrupts
# land too.
CPUS = {0: {0: 1, 1: 0, 2: 5, 3: 4}, 1: {0: 2, 1: 3, 2: 6, 3: 7}}
# Per GPU: (second of the minute, stall kind, its ms).
PLAN = {
    0: [(6.2, "swap", 30), (27.4, "cstate", 6), (33.05, "malloc", 70), (48.3, "irq", 9),
        (58.7, "contention", 12)],  # the newest: still held for late events at the end
    1: [(12.75, "irq", 11), (19.1, "contention", 40), (36.2, "faults", 14),
        (41.6, "loader", 21), (55.9, "swap", 24)],
}  # fmt: skip
IRQ_BUSY_CPU = 2  # where the NVMe's interrupts land: node 0, its device on node 1
PROBES = (
    ("sched", "running", ""),
    ("irq", "running", ""),
    ("faults", "running", ""),
    ("cstate", "degraded", "no cpuidle driver: default idle states only"),
    ("malloc", "running", ""),
    ("cuda", "running", ""),
    ("python_gc", "unavailable", "no USDT markers in the watched interpreters"),
    ("python_gil", "off", "opt-in: gpujitter probe python_gil --pid PID"),
)


def names(hostile: str = "") -> dict[str, str]:
    """The untrusted strings of the stream: GPU 0's process ("trainer"), GPU 1's ("worker"),
    their loader threads, the task that held a CPU ("kworker"), the NVMe's IRQ. Hostile
    "markup": Textual markup and actions; "control": terminal control sequences (a title,
    CSI, the 8-bit CSI), a bidi override, a line break and bytes that were not UTF-8 (as the
    probes decode them: \\xNN); "long": names far wider than any terminal (an IRQ's device
    name, a workload's, as other probes relay them)."""
    if hostile == "long":
        return {key: f"{key}-" + "x" * 300 for key in names()}
    if hostile == "control":
        return {
            "trainer": "\x1b]0;pwned\x07",
            "loader": "\x9b2J[/]",
            "worker": "gpt\u202etxt.sh",
            "kworker": "kw\nfix: rm -rf",
            "nvme": "nvme\\xff\x1b[2J",
        }
    if hostile == "markup":
        return {
            "trainer": "[bold red]x[/]",
            "loader": "[@click=quit]",
            "worker": "[@click=app.quit]boom[/]",
            "kworker": "[link=https://example.com]kw[/link]",
            "nvme": "[b]nvme0q3[/b]",
        }
    return {
        "trainer": "python3",
        "loader": "pt_data_worker",
        "worker": "python3",
        "kworker": "kworker/2:1",
        "nvme": "nvme0q3",
    }


def pid(gpu: int) -> int:
    """GPU `gpu`'s training process."""
    return TGID + PID_STEP * gpu


def thread(gpu: int, loader: bool = False) -> int:
    """GPU `gpu`'s feeding thread, or its loader thread."""
    return (LOADER if loader else TID) + PID_STEP * gpu


def cpu_reports(n: dict[str, str]) -> tuple[Timed, ...]:
    """The irq and cstate probes' halves of each CPU's figures, every second: the NVMe's
    interrupts busy on one CPU of node 0 (handled remote from the device), the CPUs the
    feeding threads run on kept out of deep idle states."""
    rng = random.Random(7)
    feeding = {CPUS[0][0], CPUS[1][0]}

    def irq_half(k: int, cpu: int) -> CpuStats:
        busy = cpu == IRQ_BUSY_CPU
        nvme = ((n["nvme"], 38 * MS, 5200),) if busy else ()
        return CpuStats(
            k, SEC, cpu,
            hardirq_ns=(41 if busy else 1) * MS + rng.randint(0, 300) * US,
            softirq_ns=rng.randint(50, 900) * US, vector_ns=300 * US,
            top_irqs=(*nvme, ("LOC", rng.randint(200, 400) * US, 1000), ("NET_RX", 90 * US, 210)),
            remote_irqs=nvme,
        )  # fmt: skip

    def idle_half(k: int, cpu: int) -> CpuStats:
        deep = 0.0 if cpu in feeding or cpu == IRQ_BUSY_CPU else rng.uniform(0.55, 0.7)
        idle = (("POLL", int(0.02 * SEC)), ("C1", int(0.1 * SEC)), ("C6", int(deep * SEC)))
        return CpuStats(k, SEC, cpu, idle_ns=idle)

    return each_second(TOPOLOGY, irq_half) + each_second(TOPOLOGY, idle_half)


def probe_reports() -> tuple[Timed, ...]:
    """Every probe's health every 10 s, with what it delivered so far."""
    out: list[Timed] = []
    for sec in range(10, MINUTE_S + 1, 10):
        t = T0 + sec * SEC
        for probe, state, reason in PROBES:
            events = sec * 900 if state == "running" else 0
            lost = 3 if probe == "sched" else 0
            status = ProbeStatus(t, probe, state, reason, events=events, lost_kernel=lost)
            out.append((t, "meta", status))
    return tuple(out)


def node(hostile: str = "") -> Node:
    n = names(hostile)
    common = {"loader": n["loader"], "stress": n["kworker"], "nvme0q1": n["nvme"]}
    return Node(
        host="gpu-node-7",
        topology=TOPOLOGY,
        gpus=GPUS,
        plan=PLAN,
        probes=tuple(ProbeStatus(T0, p, state, reason) for p, state, reason in PROBES),
        placements={
            gpu: Placement(cpus=CPUS[gpu], names={**common, "trainer": n[own]})
            for gpu, own in ((0, "trainer"), (1, "worker"))
        },
        reports=cpu_reports(n) + probe_reports(),
        seed=7,
    )


@functools.cache
def _built(hostile: str) -> bytes:
    return ndjson(engine_stream(node(hostile)))


def stream(hostile: str = "") -> list[dict[str, Any]]:
    """The records a client receives, in order: hello, snapshot, then the live minute (the
    engine runs once per kind of names in a session: its output is deterministic)."""
    return copy_of(_built(hostile))


# What the tests expect, read from the stream (what the engine made of the events).


def gap_id(rec: dict[str, Any]) -> str:
    return f"{rec['gpu']}:{rec['ts_ns']}"


def gaps_newest_first(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    gaps = [r for r in records if r["type"] == "gpu.gap"]
    return sorted(gaps, key=lambda g: (g["ts_ns"], g["gpu"]), reverse=True)


def attributions(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Gap id -> its attribution."""
    return {gap_id(r): r for r in records if r["type"] == "gpu.attribution"}


def top_causes(records: list[dict[str, Any]]) -> list[str | None]:
    """The top cause of each gap (the engine's largest part), newest first; None for a gap
    not attributed yet."""
    found = attributions(records)
    out: list[str | None] = []
    for gap in gaps_newest_first(records):
        a = found.get(gap_id(gap))
        out.append(a["parts"][0]["cause"] if a and a["parts"] else None)
    return out


def first_gap_with(records: list[dict[str, Any]], cause: str) -> tuple[int, dict[str, Any]]:
    """(row in the gaps view, newest first; the attribution) of the newest gap with a part of
    `cause`."""
    found = attributions(records)
    for row, gap in enumerate(gaps_newest_first(records)):
        a = found.get(gap_id(gap))
        if a is not None and any(p["cause"] == cause for p in a["parts"]):
            return row, a
    raise LookupError(cause)


def wall(ts_ns: int) -> str:
    """A monotonic time of the stream as the views show it (UTC)."""
    at = datetime.fromtimestamp((REALTIME_NS + ts_ns - T0) / 1e9, UTC)
    return at.strftime("%H:%M:%S.%f")[:-3]


if __name__ == "__main__":
    records = stream()
    NDJSON.write_bytes(ndjson(records))
    print(f"wrote {NDJSON} ({len(records)} records)", file=sys.stderr)
