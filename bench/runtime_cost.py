"""What the one runtime (daemon/service/runtime.py) costs per event over the bare pipeline: a
recorded trace's events through `pipeline.analyse` alone, through the runtime with no sink (its loop
and node state), and with the daemon's file and counting sinks (trace capture, attribution log,
metrics; their files' opening and closing fsync included), best of a few rounds each.
CPU time of this process, not wall time: the loop gives the CPU away every 2 ms
(`in_slices`), and on a busy node what others run then is not the runtime's cost.

    .venv/bin/python -m bench.runtime_cost [TRACE]
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from gpujitter.daemon.analysis.pipeline import AnalysisConfig, analyse
from gpujitter.daemon.service.runtime import ListSource, Runtime
from gpujitter.daemon.sinks.adapters import CaptureSink, LogSink, MetricsSink
from gpujitter.daemon.sinks.capture import TraceCapture
from gpujitter.daemon.sinks.jsonlog import JsonLog
from gpujitter.daemon.sinks.metrics import DaemonMetrics
from gpujitter.daemon.sinks.trace import TraceReader

TRACE = Path(__file__).parents[1] / "examples" / "h200-training.gjtrace"
ROUNDS = 5


def best_s(run: Callable[[], None]) -> float:
    times = []
    for _ in range(ROUNDS):
        start = time.process_time()
        run()
        times.append(time.process_time() - start)
    return min(times)


def main(path: Path) -> None:
    with TraceReader(path) as reader:
        header, events = reader.header, list(reader)
    config = AnalysisConfig.from_record(header.analysis)

    def bare() -> None:
        for _ in analyse(events, header.topology, config):
            pass

    def runtime_alone() -> None:
        Runtime(ListSource(events), header.topology, analysis=lambda _: config,
                signals=False).run()  # fmt: skip

    def through_runtime() -> None:
        with tempfile.TemporaryDirectory() as work:
            sinks = [
                CaptureSink(TraceCapture(Path(work) / "t.gjtrace", header)),
                LogSink(JsonLog(Path(work) / "a.jsonl")),
                MetricsSink(DaemonMetrics(), ("log", "trace")),
            ]
            Runtime(ListSource(events), header.topology, sinks=sinks,
                    analysis=lambda _: config, signals=False).run()  # fmt: skip

    n = len(events)
    print(f"{path.name}: {n} events, µs per event")
    rows = (("pipeline alone", bare), ("runtime, no sink", runtime_alone),
            ("runtime, daemon's sinks", through_runtime))  # fmt: skip
    for name, run in rows:
        print(f"  {name:<24} {best_s(run) * 1e6 / n:6.2f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else TRACE)
