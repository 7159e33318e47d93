"""What the gap detector costs per event on a gappy job: the synthetic stream of
tests/fixtures/streams/synthetic.py `gappy_steps` (per GPU a process of ~20 steps a second,
each with a host-side gap of 10-16 ms; power every 20 ms, read in batches 500 ms apart as the
sampler does) through `GapDetector.feed`, CPU time of this process, best of --rounds.
A job that starves its GPU every step keeps ~60 candidates a GPU pending through their 3 s
of settling, and every power sample is evidence that may settle one.

    .venv/bin/python -m bench.gap_detector [--gpus 1,4] [--seconds 60] [--rounds 5]
        [--before DIR] [--json]

--before DIR alternates fresh processes of this tree and of the package laid out in DIR (a
`git archive` of an earlier commit): before, this, this, before, ... The gaps each tree
found are hashed, so a cut that changes what is decided shows.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from typing import Any

from bench import alternated
from gpujitter.daemon.analysis.gaps import GapDetector
from tests.fixtures.streams.synthetic import gappy_steps


def measure(gpus: int, seconds: int, rounds: int) -> dict[str, Any]:
    events = gappy_steps(gpus, seconds)
    best, gaps = float("inf"), []
    for _ in range(rounds):
        detector = GapDetector()
        start = time.process_time()
        gaps = [gap for ev in events for gap in detector.feed(ev)]
        gaps += detector.flush()
        best = min(best, time.process_time() - start)
    return {
        "gpus": gpus,
        "events": len(events),
        "gaps": len(gaps),
        "us_per_event": best / len(events) * 1e6,
        "gaps_sha256": hashlib.sha256(repr(gaps).encode()).hexdigest()[:16],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", default="1,4", help="GPU counts, comma-separated")
    parser.add_argument("--seconds", type=int, default=60, help="the stream's length")
    parser.add_argument("--rounds", type=int, default=5, help="best of this many passes")
    parser.add_argument("--before", metavar="DIR", default="",
                        help="alternate with the package laid out there")  # fmt: skip
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.gpus = [int(g) for g in args.gpus.split(",")]
    if args.before:
        argv = ["--gpus", ",".join(map(str, args.gpus)), "--seconds", str(args.seconds),
                "--rounds", str(args.rounds)]  # fmt: skip
        runs = alternated("bench.gap_detector", argv, args.before, 2)
        results = [{"tree": tree, **r} for tree, found in runs for r in found]
    else:
        results = [measure(g, args.seconds, args.rounds) for g in args.gpus]
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for r in results:
        print(f"{r.get('tree', 'this'):<24} {r['gpus']} GPU(s): {r['events']} events, "
              f"{r['gaps']} gaps, {r['us_per_event']:.1f} µs an event "
              f"(gaps {r['gaps_sha256']})")  # fmt: skip


if __name__ == "__main__":
    main()
