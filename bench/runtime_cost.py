"""What the one runtime (daemon/service/runtime.py) costs per event over the bare pipeline: a
recording's events through `pipeline.analyse` alone, through the runtime with no sink (its loop
and node state), and with the sinks `gpujitter run` configures (trace capture, attribution log,
the socket stream with no client, metrics; rotation as the default settings have it; the
files' opening and closing fsync included):
the main thread's whole per-event path as the daemon runs it, minus the probes' decoding.
CPU time of this process, not wall time: the loop gives the CPU away every 2 ms
(`in_slices`), and on a busy node what others run then is not the runtime's cost. Each row
is the best of --rounds; --profile FILE writes a cProfile of one more run of the last row.

    .venv/bin/python -m bench.runtime_cost [TRACE_OR_DIR] [--rounds N] [--json]

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


def measure(path: Path, rounds: int, profile: str = "") -> dict[str, float]:
    """µs per event of each row, best of `rounds`."""
    rec = open_recording([path])
    header, events = rec.header, list(rec)
    config = AnalysisConfig.from_record(header.analysis)

    def bare() -> None:
        for _ in analyse(events, header.topology, config):
            pass

    def runtime_alone() -> None:
        Runtime(ListSource(events), header.topology, analysis=lambda _: config,
                signals=False).run()  # fmt: skip

    def through_runtime() -> None:
        with tempfile.TemporaryDirectory() as work:

            def sinks(runtime: Runtime) -> list[Sink]:
                stream = StreamServer(Path(work) / "sock", hello=dict, snapshot=list).start()
                return [
                    CaptureSink(TraceCapture(Path(work) / "rec", header, rotation("record"))),
                    LogSink(JsonLog(Path(work) / "a.jsonl", rotation("log"))),
                    StreamSink(stream, runtime.state),
                    MetricsSink(DaemonMetrics(), ("trace", "log", "stream")),
                ]

            Runtime(ListSource(events), header.topology, sinks=sinks,
                    analysis=lambda _: config, signals=False).run()  # fmt: skip

    n = len(events)
    rows = {"pipeline alone": bare, "runtime, no sink": runtime_alone,
            "runtime, daemon's sinks": through_runtime}  # fmt: skip
    out = {name: best_s(run, rounds) * 1e6 / n for name, run in rows.items()}
    if profile:
        import cProfile

        cProfile.runctx("through_runtime()", globals(), locals(), profile)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path, nargs="?", default=TRACE)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", default="", metavar="FILE")
    args = parser.parse_args()
    res = measure(args.path, args.rounds, args.profile)
    tree = str(Path(gpujitter.daemon.__file__).parents[1])
    if args.json:
        print(json.dumps({"path": str(args.path), "tree": tree, "us_per_event": res}))
        return
    print(f"{args.path.name} (package from {tree}): µs per event")
    for name, us in res.items():
        print(f"  {name:<24} {us:6.2f}")


if __name__ == "__main__":
    main()
