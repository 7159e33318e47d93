"""A minute of a two-GPU, two-node training node as the daemon's socket streams it
(docs/schema.md "Socket messages"): the TUI's fixed test data and the replay demo.

Synthetic but shaped like the real thing: NVML samples at the H200's periods scaled down
(util 200 ms, power 100 ms), gaps placed by cuda launches with attributions (parts with
cause, ns and evidence), per-CPU statistics in the irq and cstate probes' two halves, and
the daemon's status with the watched threads' placement. Every record is built as the
daemon's own typed record (daemon/analysis/records.py, probes/events.py,
daemon/service/status.py) and written as the daemon writes it, so a field the daemon lacks
or types otherwise fails here; the gaps' causes and shares are chosen, not derived by the
engine (tests/tui/eight_gpus.py is the engine's own output). Deterministic:
`python -m tests.tui.node_stream` rewrites tests/fixtures/tui/node-stream.ndjson, and a
test checks the committed file is what this produces.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import orjson

import gpujitter.daemon.analysis.records  # noqa: F401 (registers the gap and attribution kinds)
from gpujitter.daemon.service.status import DaemonStatus, WatchedThread
from gpujitter.probes.events import from_record, to_record

NDJSON = Path(__file__).parents[1] / "fixtures/tui/node-stream.ndjson"

S = 1_000_000_000
MS = 1_000_000
US = 1_000
T0 = 5000 * S  # monotonic start of the minute
# 2026-03-02 12:00:00 UTC at T0
CLOCK = {"type": "meta.clock", "ts_ns": T0, "realtime_ns": 1_772_452_800 * S}
MINUTE = 60 * S

CPU_NODE = {c: 0 if c < 4 else 1 for c in range(8)}
GPUS = [
    {"index": 0, "name": "NVIDIA H200", "pci_bus_id": "0000:17:00.0", "numa_node": 0,
     "local_cpus": [0, 1, 2, 3]},
    {"index": 1, "name": "NVIDIA H200", "pci_bus_id": "0000:b1:00.0", "numa_node": 1,
     "local_cpus": [4, 5, 6, 7]},
]  # fmt: skip


def names(hostile: str = "") -> dict[str, str]:
    """The untrusted strings of the stream. Hostile "markup": Textual markup and actions;
    "control": terminal control sequences (a title, CSI, the 8-bit CSI), a bidi override, a
    line break and bytes that were not UTF-8 (as the probes decode them: \\xNN)."""
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


# (start s, duration ms, gpu, parts as (cause, ms, evidence), critical tid)
GAPS = [
    (6.20, 42.0, 0, [("swap_in", 30.0, "swap"), ("minor_faults", 8.0, "minor"),
                     ("unexplained", 4.0, "reason")], 4125),
    (12.75, 18.5, 1, [("irq", 11.0, "irq"), ("runq_wait", 5.5, "task"),
                      ("host_work", 2.0, None)], 4126),
    (19.10, 64.0, 1, [("runq_wait", 40.0, "task_mig"), ("remote_oncpu", 20.0, "node"),
                      ("unexplained", 4.0, "reason")], 4126),
    (27.40, 9.2, 0, [("idle_wake", 6.2, "idle"), ("host_work", 3.0, None)], 4125),
    (33.05, 120.0, 0, [("alloc_stall", 70.0, "alloc"), ("blocked", 38.0, "syscall"),
                       ("unexplained", 12.0, "reason")], 4125),
    (41.60, 25.0, 1, [("major_fault", 21.0, "file"), ("host_work", 4.0, None)], 4126),
    (48.30, 14.0, 0, [("irq", 9.0, "irq"), ("idle_wake", 5.0, "idle")], 4125),
    (55.90, 31.0, 1, [("swap_in", 24.0, "swap"), ("runq_wait", 7.0, "task")], 4126),
    (58.70, 12.0, 0, None, 4125),  # the newest: still being attributed
]  # fmt: skip

REMEDIES = {
    "swap_in": "sysctl -w vm.swappiness=10; add RAM or move the swap off this node",
    "irq": "echo 0-3 > /proc/irq/36/smp_affinity_list  # nvme0 to the GPU's node",
    "runq_wait": "taskset -acp 4-7 4122  # pin rank 1 to its GPU's node",
    "alloc_stall": "LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF=background_thread:true",
    "idle_wake": "cpupower idle-set -D 10  # no idle states slower than 10 us",
    "major_fault": "vmtouch -t the dataset, or read it with O_DIRECT",
}


def evidence(kind: str | None, ms: float, gpu: int, start: int, n: dict[str, str]) -> list:
    ns = int(ms * MS)
    cpu = 1 if gpu == 0 else 6
    if kind == "swap":
        return [
            {
                "what": "fault",
                "kind": "swap",
                "count": 37,
                "ns": ns,
                "cpus": [cpu],
                "addresses": [0x7F3A12C00000, 0x7F3A12C01000],
            }
        ]
    if kind == "minor":
        return [{"what": "fault", "kind": "minor", "count": 912, "ns": ns, "cpus": [cpu]}]
    if kind == "irq":
        return [
            {
                "what": "irq",
                "irq_kind": "hardirq",
                "irq": 36,
                "name": n["nvme"],
                "cpus": [cpu],
                "count": 48,
                "ns": ns,
                "device_node": 1 - gpu,
                "remote_to_gpu": True,
                "handled_remote": False,
            }
        ]
    if kind == "task":
        return [
            {
                "what": "task",
                "tid": 77,
                "comm": n["kworker"],
                "cpus": [cpu],
                "count": 3,
                "ns": ns,
                "after_migration": False,
            }
        ]
    if kind == "task_mig":
        return [
            {
                "what": "task",
                "tid": 4130,
                "comm": n["loader"],
                "cpus": [2],
                "count": 5,
                "ns": ns,
                "after_migration": True,
            },
            {
                "what": "migration",
                "at_ns": start + 3 * MS,
                "tid": 4126,
                "src_cpu": 6,
                "dst_cpu": 2,
                "src_node": 1,
                "dst_node": 0,
            },
        ]
    if kind == "node":
        return [{"what": "node", "node": 0, "cpus": [2], "ns": ns, "remote": True}]
    if kind == "idle":
        return [
            {
                "what": "idle",
                "state": 3,
                "state_name": "C6",
                "cpus": [cpu],
                "count": 4,
                "ns": ns,
                "exit_latency_ns": 133 * US,
            }
        ]
    if kind == "alloc":
        return [
            {
                "what": "alloc",
                "call": "munmap",
                "allocator": "",
                "count": 6,
                "ns": ns,
                "bytes": 512 << 20,
            }
        ]
    if kind == "syscall":
        return [
            {
                "what": "syscall",
                "state": "sleeping",
                "syscall": "futex",
                "nr": 202,
                "count": 2,
                "ns": ns,
            }
        ]
    if kind == "file":
        return [
            {
                "what": "fault",
                "kind": "file",
                "count": 14,
                "ns": ns,
                "cpus": [cpu],
                "addresses": [0x7F0000200000],
            }
        ]
    if kind == "reason":
        return [{"what": "reason", "reason": "short_offcpu", "ns": ns}]
    return []


def stream(hostile: str = "") -> list[dict[str, Any]]:
    """The records a client receives, in order: hello, snapshot, then the live minute."""
    n = names(hostile)
    rng = random.Random(7)
    tgid = {0: 4121, 1: 4122}
    comm = {4121: n["trainer"], 4122: n["worker"]}
    probes = [
        ("sched", "running", ""),
        ("irq", "running", ""),
        ("faults", "running", ""),
        ("cstate", "degraded", "no cpuidle driver: default idle states only"),
        ("malloc", "off", "opt-in: gpujitter probe malloc --pid PID"),
        ("cuda", "unavailable", "libcuda.so.1 not found in any watched process"),
    ]
    out: list[dict[str, Any]] = [
        {
            "type": "hello", "schema": "gpujitter.stream/1", "scope": "all",
            "version": "0.1.0", "host": "gpu-node-7", "kernel": "6.18.44-gpu", "pid": 2301,
            "clock": CLOCK,
            "topology": {"cpu_node": {str(c): v for c, v in CPU_NODE.items()},
                         "irq_node": {"36": 1, "40": 0},
                         "gpu_node": {g["pci_bus_id"]: g["numa_node"] for g in GPUS},
                         "override": None},
            "probes": [p for p, _, _ in probes],
        },
        {
            "type": "snapshot", "ts_ns": T0, "gpus": GPUS,
            "probes": [as_sent(probe(p, s, r, T0)) for p, s, r in probes],
            "gaps": [], "attributions": [], "cpus": [], "status": status(T0, n, 1.2),
        },
    ]  # fmt: skip
    gaps = [
        (T0 + round(s * 1000) * MS, round(d * MS), g, parts, tid) for s, d, g, parts, tid in GAPS
    ]
    live: list[tuple[int, int, dict[str, Any]]] = []  # (emission time, order, record)

    def emit(at: int, rec: dict[str, Any]) -> None:
        live.append((at, len(live), rec))

    for gpu in (0, 1):
        emit(T0 + 5 * MS, {"type": "gpu.procs", "ts_ns": T0 + 5 * MS, "gpu": gpu,
                           "pids": [tgid[gpu]]})  # fmt: skip
        for metric, period in (("util", 200 * MS), ("power", 100 * MS)):
            for t in range(T0 + period, T0 + MINUTE + 1, period):
                idle = sum(
                    max(0, min(t, s + d) - max(t - period, s)) for s, d, g, _, _ in gaps if g == gpu
                )
                busy = 1 - idle / period
                if metric == "util":
                    value = round(busy * rng.uniform(93, 99), 1)
                else:
                    value = round(110 + busy * rng.uniform(520, 560), 1)
                emit(t, {"type": "gpu.sample", "ts_ns": t, "gpu": gpu, "metric": metric,
                         "value": value, "period_ns": period})  # fmt: skip
    for start, dur, gpu, parts, tid in gaps:
        end = start + dur
        gap = {"type": "gpu.gap", "ts_ns": start, "end_ns": end, "gpu": gpu,
               "sources": ["cuda", "power"], "resolution_ns": 2 * US, "confidence": 0.92,
               "tgids": [tgid[gpu]], "tid_before": tid, "tid_after": tid}  # fmt: skip
        emit(end, gap)
        if parts is None:
            continue
        rec = {**gap, "type": "gpu.attribution",
               "parts": [{"cause": c, "ns": int(ms * MS), "tids": [tid],
                          "evidence": evidence(kind, ms, gpu, start, n)}
                         for c, ms, kind in parts],
               "tid": tid, "tgid": tgid[gpu], "comm": comm[tgid[gpu]], "gpu_node": gpu,
               "threads": [{"tid": tid, "tgid": tgid[gpu], "comm": comm[tgid[gpu]],
                            "role": "critical", "ns": dur, "top_cause": parts[0][0]},
                           {"tid": 4130, "tgid": 4121, "comm": n["loader"],
                            "role": "sibling", "ns": dur // 3, "top_cause": "blocked"}],
               "remedies": [REMEDIES[c] for c, _, _ in parts if c in REMEDIES][:2],
               "probes_off": ["cuda"]}  # fmt: skip
        emit(end + 150 * MS, rec)  # the engine waits for late probe data
    for sec in range(1, 61):
        t = T0 + sec * S
        for cpu in range(8):
            busy_irq = cpu == 2
            top = [[n["nvme"], 38 * MS, 5200]] if busy_irq else []
            top += [["LOC", rng.randint(200, 400) * US, 1000], ["NET_RX", 90 * US, 210]]
            emit(
                t,
                {
                    "type": "cpu.stats",
                    "ts_ns": t - S,
                    "interval_ns": S,
                    "cpu": cpu,
                    "hardirq_ns": (41 if busy_irq else 1) * MS + rng.randint(0, 300) * US,
                    "softirq_ns": rng.randint(50, 900) * US,
                    "vector_ns": 300 * US,
                    "top_irqs": top,
                    "remote_irqs": [[n["nvme"], 38 * MS, 5200]] if busy_irq else [],
                },
            )
            deep = 0.0 if cpu in (1, 2, 6) else rng.uniform(0.55, 0.7)
            emit(t, {"type": "cpu.stats", "ts_ns": t - S, "interval_ns": S, "cpu": cpu,
                     "idle_ns": [["POLL", int(0.02 * S)], ["C1", int(0.1 * S)],
                                 ["C6", int(deep * S)]]})  # fmt: skip
        emit(t, status(t, n, round(rng.uniform(0.9, 1.6), 1)))
        if sec % 10 == 0:
            for p, s, r in probes:
                emit(t, probe(p, s, r, t, events=sec * 900 if s == "running" else 0))
    live.sort(key=lambda e: (e[0], e[1]))
    return out + [as_sent(rec) for _, _, rec in live]


def probe(name: str, state: str, reason: str, t: int, events: int = 0) -> dict[str, Any]:
    return {"type": "meta.probe", "ts_ns": t, "probe": name, "state": state, "reason": reason,
            "events": events, "lost_kernel": 3 if name == "sched" and events else 0,
            "lost_user": 0}  # fmt: skip


def status(t: int, n: dict[str, str], cpu_percent: float) -> dict[str, Any]:
    return DaemonStatus(
        ts_ns=t, cpu_percent=cpu_percent, rss_bytes=61 << 20, events_per_s=2400.0,
        lost_kernel=3, clients=1,
        threads=(
            WatchedThread(tid=4125, tgid=4121, comm=n["trainer"], cpu=1, node=0),
            WatchedThread(tid=4130, tgid=4121, comm=n["loader"], cpu=5, node=1),
            WatchedThread(tid=4126, tgid=4122, comm=n["worker"], cpu=2, node=0),
            WatchedThread(tid=4131, tgid=4122, comm=n["loader"], cpu=6, node=1),
        ),
    ).to_record()  # fmt: skip


def as_sent(rec: dict[str, Any]) -> dict[str, Any]:
    """A record as the daemon serialises it: built as its own typed record (so a kind it
    does not know, a field its type lacks or one of the wrong type fails here), then
    written out. The status is built as a DaemonStatus already."""
    typed = rec if rec["type"] == "daemon.status" else to_record(from_record(rec))
    return orjson.loads(orjson.dumps(typed))  # type: ignore[no-any-return]


def ndjson(records: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


if __name__ == "__main__":
    NDJSON.write_bytes(ndjson(stream()))
    print(f"wrote {NDJSON} ({len(stream())} records)", file=sys.stderr)
