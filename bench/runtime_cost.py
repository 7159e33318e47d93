"""What the one runtime (daemon/service/runtime.py) costs per event over the bare pipeline: a
recording's events through `pipeline.analyse` alone, through the runtime with no sink (its loop
and node state), with the sinks `gpujitter run` configures by default (attribution log, the
socket stream with no client, metrics; rotation as the default settings have it; the files'
opening and closing fsync included): the main thread's whole per-event path as the daemon
runs it, minus the probes' decoding; and with the trace capture `--record` adds to them
(this row was "runtime, daemon's sinks" before 2026-12-06: the capture is off by default).
CPU time of this process, not wall time: the loop gives the CPU away every 2 ms
(`in_slices`), and on a busy node what others run then is not the runtime's cost. Each row
is the best of --rounds; --profile FILE writes a cProfile of one more run of the last row;
--by-kind times the default sinks' row per event type as well (what each kind costs the
daemon's main thread, and at the recording's rates, a second of it).

    .venv/bin/python -m bench.runtime_cost [TRACE_OR_DIR] [--rounds N] [--by-kind] [--json]

To compare two trees, run it alternately with each tree's package first on the path
(docs/performance.md, "The main thread per event").
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import gpujitter.daemon
from gpujitter.daemon.analysis.pipeline import AnalysisConfig, analyse
from gpujitter.daemon.offline.recordings import open_recording
from gpujitter.daemon.service.config import load_config
from gpujitter.daemon.service.runtime import ListSource, Runtime, Sink
from gpujitter.daemon.sinks.adapters import CaptureSink, LogSink, MetricsSink, StreamSink
from gpujitter.daemon.sinks.capture import TraceCapture
from gpujitter.daemon.sinks.jsonlog import JsonLog
from gpujitter.daemon.sinks.metrics import DaemonMetrics
from gpujitter.daemon.sinks.rotation import Rotation
from gpujitter.daemon.sinks.stream import StreamServer
from gpujitter.probes.events import Event

TRACE = Path(__file__).parents[1] / "examples" / "h200-training.gjtrace"


def rotation(sink: str) -> Rotation:
    """A file sink's rotation as the daemon's default settings make it."""
    config = load_config(environ={})
    return Rotation(max_bytes=config[f"{sink}.max_bytes"], keep_files=config[f"{sink}.keep"])


def best_s(run: Callable[[], None], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def measure(path: Path, rounds: int, profile: str = "", by_kind: bool = False) -> dict[str, Any]:
    """µs per event of each row, best of `rounds`; by_kind: also the default sinks' row per
    event type (each type's best of `rounds`), with its rate in the recording."""
    rec = open_recording([path])
    header, events = rec.header, list(rec)
    config = AnalysisConfig.from_record(header.analysis)

    def bare() -> None:
        for _ in analyse(events, header.topology, config):
            pass

    def runtime_alone() -> None:
        Runtime(ListSource(events), header.topology, analysis=lambda _: config,
                signals=False).run()  # fmt: skip

    def through_runtime(runtime_type: type[Runtime] = Runtime, record: bool = True) -> None:
        with tempfile.TemporaryDirectory() as work:

            def sinks(runtime: Runtime) -> list[Sink]:
                stream = StreamServer(Path(work) / "sock", hello=dict, snapshot=list).start()
                capture, names = [], ("log", "stream")
                if record:
                    trace = TraceCapture(Path(work) / "rec", header, rotation("record"))
                    capture, names = [CaptureSink(trace)], ("trace", *names)
                return [
                    *capture,
                    LogSink(JsonLog(Path(work) / "a.jsonl", rotation("log"))),
                    StreamSink(stream, runtime.state),
                    MetricsSink(DaemonMetrics(), names),
                ]

            runtime_type(ListSource(events), header.topology, sinks=sinks,
                         analysis=lambda _: config, signals=False).run()  # fmt: skip

    n = len(events)
    rows = {"pipeline alone": bare, "runtime, no sink": runtime_alone,
            "runtime, default sinks": lambda: through_runtime(record=False),
            "runtime, + trace capture": through_runtime}  # fmt: skip
    out: dict[str, Any] = {name: best_s(run, rounds) * 1e6 / n for name, run in rows.items()}
    if by_kind:
        spent: dict[str, list[int]] = {}
        for _ in range(rounds):
            KindTimed.spent = {}
            through_runtime(KindTimed, record=False)
            for kind, (count, ns) in KindTimed.spent.items():
                best = spent.setdefault(kind, [count, ns])
                best[1] = min(best[1], ns)
        span_s = max(1, events[-1].ts_ns - events[0].ts_ns) / 1e9 if events else 1.0
        out["by_kind"] = {
            kind: {
                "per_s": count / span_s,
                "us_per_event": ns / count / 1e3,
                "ms_per_s": ns / 1e6 / span_s,
            }
            for kind, (count, ns) in sorted(spent.items(), key=lambda kv: -kv[1][1])
        }
    if profile:
        import cProfile

        cProfile.runctx("through_runtime()", globals(), locals(), profile)
    return out


class KindTimed(Runtime):
    """The runtime with each event's whole path (node state, sinks, pipeline) timed in thread
    CPU, by event type (two clock reads an event, ~0.2 µs, included)."""

    spent: ClassVar[dict[str, list[int]]] = {}

    def _event(self, ev: Event) -> None:
        start = time.thread_time_ns()
        super()._event(ev)
        row = self.spent.setdefault(type(ev).__name__, [0, 0])
        row[0] += 1
        row[1] += time.thread_time_ns() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, nargs="?", default=TRACE)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", default="", metavar="FILE")
    parser.add_argument("--by-kind", action="store_true",
                        help="also the default sinks' row per event type")  # fmt: skip
    args = parser.parse_args()
    res = measure(args.path, args.rounds, args.profile, args.by_kind)
    kinds = res.pop("by_kind", {})
    tree = str(Path(gpujitter.daemon.__file__).parents[1])
    if args.json:
        print(json.dumps({"path": str(args.path), "tree": tree, "us_per_event": res,
                          "by_kind": kinds}))  # fmt: skip
        return
    print(f"{args.path.name} (package from {tree}): µs per event")
    for name, us in res.items():
        print(f"  {name:<24} {us:6.2f}")
    if kinds:
        print("runtime, default sinks, by event type: a second of the recording, µs each, ms")
        for kind, row in kinds.items():
            print(f"  {kind:<16} {row['per_s']:7.1f}/s {row['us_per_event']:7.2f} µs "
                  f"{row['ms_per_s']:7.3f} ms/s")  # fmt: skip


if __name__ == "__main__":
    main()
