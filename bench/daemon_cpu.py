"""The daemon's own CPU, by thread: `gpujitter run` watching a feeding loop (the drills'
stub libcuda) or a given process, its threads' on-CPU time read from /proc over a window;
and a recorded trace replayed, for the user-space cost per event of decoding and analysis.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.daemon_cpu live --seconds 60
    .venv/bin/python -m bench.daemon_cpu replay TRACE_OR_DIR

live needs root (the probes). The daemon runs as installed: its defaults, the attribution
log and the socket on, no client, no recording; what it delivered by probe, and the
attributions it made in the window (self-inflicted ones apart), come from the status it
serves a client connecting for a moment at each end of the window. --record yes adds
`run --record` (off in its defaults) for the events' count by kind, its cost included;
--record alternate runs rounds with and without it.
--pid PID watches that process instead of the feeder, --before DIR alternates rounds with
the package found in DIR (another tree), --profile DIR writes a profile per thread there: a
cProfile file per thread (NAME.prof) where the interpreter gives each thread one (Python
< 3.12), else py-spy's samples of the window by thread (py-spy-this.txt, raw;
py-spy-this.json, each thread's top functions), py-spy found on PATH or in a bin/ beside
sys.path's entries (`pip install --target` puts it there), and the run's recording
(rec-this/; a profiled run records), for `replay`.
Each thread's time is its schedstat run time,
summed by thread name; a thread that exited inside the window counts in the process's
total only ("exited threads"). The daemon runs through `daemon` below, which gives each
Python thread its role as its kernel name (gpujitter-probes -> "probes") so that /proc
tells them apart. The window opens a second after READY (start-up work left out), or
--settle seconds after it. For the steady state settle past the engine's retention (60 s,
EngineConfig.retention_ns; e.g. --settle 90): until its timelines are full nothing is
evicted, and a window in the first minute misses that work (on the H200, 2026-12-04, a
cost that grew with the timelines read 2.2-2.8 % there and 2.9 % at 170 s).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 60.0
STATUS_TIMEOUT_S = 5.0
PY_SPY_RATE_HZ = 250
FRAME_LINE = re.compile(r":\d+\)$")  # py-spy's "func (file.py:12)" -> "func (file.py)"
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _thread_ns(task: Path) -> tuple[int, int]:
    """A thread's on-CPU time and the times it was put on a CPU (its wake-ups, near
    enough): schedstat's run time and slices, else utime + stime at tick resolution and
    the context switches."""
    try:
        run_ns, _, slices = (task / "schedstat").read_text().split()[:3]
        return int(run_ns), int(slices)
    except (OSError, ValueError):
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        status = (task / "status").read_text().splitlines()
        switches = sum(int(line.split()[1]) for line in status if "ctxt_switches:" in line)
        return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // TICKS_PER_S, switches


def threads_ns(pid: int) -> dict[int, tuple[str, int, int]]:
    """tid -> (thread name, on-CPU ns so far, times put on a CPU so far) for each live
    thread of `pid`."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = ((task / "comm").read_text().strip(), *_thread_ns(task))
        except (OSError, ValueError):
            continue  # exited between the listing and the read
    return out


def process_ns(pid: int) -> int:
    """The whole process's on-CPU time, exited threads included (utime + stime, ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // TICKS_PER_S


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def split_by_name(
    before: dict[int, tuple[str, int, int]], after: dict[int, tuple[str, int, int]]
) -> tuple[dict[str, int], dict[str, int]]:
    """On-CPU ns spent inside the window, and the times put on a CPU, by thread name
    (threads born inside it count all)."""
    spent: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    for tid, (name, ns, slices) in after.items():
        _, ns0, slices0 = before.get(tid, (name, 0, 0))
        spent[name] += ns - ns0
        runs[name] += slices - slices0
    return dict(spent), dict(runs)


def profiled(name: str, run: Callable[[], object], profile_dir: str) -> None:
    """run() on this thread, with a profile_dir under a cProfile of its own written there
    as NAME.prof. Where the interpreter refuses it a profiler (3.12+ has one per process:
    `live` samples with py-spy there), run() runs unprofiled, said on stderr."""
    import cProfile

    if not profile_dir:
        run()
        return
    prof = cProfile.Profile(time.thread_time)  # CPU time: waits are not its cost
    try:
        prof.enable()
    except ValueError as err:
        print(f"daemon_cpu: thread {name} not profiled: {err}", file=sys.stderr)
        run()
        return
    try:
        run()
    finally:
        prof.disable()
        prof.dump_stats(f"{profile_dir}/{name}.prof")


def run_named(argv: list[str], profile_dir: str) -> None:
    """`gpujitter ARGV` in this process, each thread named in the kernel after its role
    and, with a profile_dir, profiled on its own (cProfile follows one thread)."""
    import runpy
    import threading

    start_thread = threading.Thread.run

    def named_run(self: threading.Thread) -> None:
        name = self.name.removeprefix("gpujitter-")[:15]
        with contextlib.suppress(OSError):
            Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name)
        profiled(name, lambda: start_thread(self), profile_dir)

    threading.Thread.run = named_run  # type: ignore[method-assign]
    Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text("main")
    sys.argv = ["gpujitter", *argv]
    profiled("main", lambda: runpy.run_module("gpujitter", run_name="__main__"), profile_dir)


def per_thread_cprofile() -> bool:
    """Whether cProfile can follow one thread at a time in this interpreter: from 3.12 it
    takes the interpreter's one profiling slot (sys.monitoring), so every thread's but the
    first is refused ("Another profiling tool is already active")."""
    return sys.version_info < (3, 12)


def find_py_spy() -> str:
    """py-spy on PATH, else in a bin/ beside an entry of sys.path (`pip install --target`
    puts it there); "" when there is none."""
    if found := shutil.which("py-spy"):
        return found
    for entry in sys.path:
        candidate = Path(entry or ".") / "bin" / "py-spy"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return ""


def summarise_py_spy(lines: list[str], top: int = 30) -> dict[str, Any]:
    """Per thread (by role, as `daemon` names them), from py-spy's raw output with thread
    ids ("thread (TID): NAME;frame;...;frame COUNT"): its samples, and the functions with
    the most samples as the innermost frame (self) and anywhere on the stack (total)."""
    selfs: dict[str, Counter[str]] = {}
    totals: dict[str, Counter[str]] = {}
    samples: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread, *frames = stack.split(";")
        name = thread.partition(": ")[2] or thread
        name = "main" if name == "MainThread" else name.removeprefix("gpujitter-")
        funcs = [FRAME_LINE.sub(")", f) for f in frames]
        samples[name] += int(count)
        if funcs:
            selfs.setdefault(name, Counter())[funcs[-1]] += int(count)
        for func in set(funcs):
            totals.setdefault(name, Counter())[func] += int(count)
    return {
        name: {
            "samples": n,
            "self": selfs.get(name, Counter()).most_common(top),
            "total": totals.get(name, Counter()).most_common(top),
        }
        for name, n in samples.most_common()
    }


def _feeder(work: Path, seconds: float) -> subprocess.Popen[str]:
    from gpujitter.daemon.drill.build import cached_inject, cached_stub
    from gpujitter.daemon.drill.feeder import FeederConfig

    cfg = FeederConfig(backend="stub", inject_lib=str(cached_inject()), scenario="clean",
                       cpu=0, duration_s=seconds + 5, stall_ms=25.0,
                       stub=str(cached_stub()))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpujitter.daemon.drill.feeder", cfg.to_json()],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=work,
    )  # fmt: skip
    assert proc.stdout is not None
    json.loads(proc.stdout.readline())  # {"ready": ...}
    return proc


def _wait_ready(sock: socket.socket, daemon: subprocess.Popen[bytes]) -> float:
    start = time.monotonic()
    while time.monotonic() - start < READY_TIMEOUT_S:
        if daemon.poll() is not None:
            raise SystemExit(f"daemon exited with {daemon.returncode} before READY")
        try:
            if b"READY=1" in sock.recv(4096):
                return time.monotonic() - start
        except TimeoutError:
            continue
    raise SystemExit("daemon not READY in time")


def _daemon_status(path: Path) -> dict[str, Any]:
    """The daemon's status record from the snapshot its stream sends a new client (the
    probes' delivered and lost counts, the attributions and how many were self-inflicted);
    {} when none came in time. A client for a moment: the stream's cost while none is
    connected stays out of the window."""
    from gpujitter.daemon.sinks.stream import first_records

    try:
        snapshot = first_records(path, ["snapshot"], STATUS_TIMEOUT_S).get("snapshot", {})
    except OSError:
        return {}
    return dict(snapshot.get("status") or {})


def _window_counts(first: dict[str, Any], last: dict[str, Any], window_s: float) -> dict[str, Any]:
    """What the daemon counted between two of its status records: events a second by probe,
    each probe's state at the end, and the attributions, self-inflicted ones and lost events
    in the window."""
    if not first or not last:
        return {}

    def events(status: dict[str, Any]) -> dict[str, int]:
        return {p: int(c.get("events", 0)) for p, c in (status.get("probe_cost") or {}).items()}

    before, after = events(first), events(last)
    by_probe = {p: round((n - before.get(p, 0)) / window_s, 1) for p, n in after.items()}
    keys = ("attributions", "self_inflicted", "lost_kernel", "lost_user")
    return {
        "events_per_s_by_probe": dict(sorted(by_probe.items(), key=lambda kv: -kv[1])),
        # a probe that delivered nothing: running with nothing to see, or degraded?
        "probe_states": {p: c.get("state", "") for p, c in (last.get("probe_cost") or {}).items()},
        **{k: int(last.get(k, 0)) - int(first.get(k, 0)) for k in keys},
    }


def _start_py_spy(py_spy: str, pid: int, seconds: float, out: Path) -> subprocess.Popen[str]:
    """py-spy sampling process `pid`'s threads for `seconds` into `out` (raw, by thread),
    without stopping it (--nonblocking: the daemon's own timing stays its own)."""
    argv = [py_spy, "record", "-p", str(pid), "-d", str(math.ceil(seconds)), "-r",
            str(PY_SPY_RATE_HZ), "-f", "raw", "-t", "--nonblocking", "-o", str(out)]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _py_spy_profile(spy: subprocess.Popen[str], raw: Path) -> dict[str, Any]:
    """py-spy's samples by thread once it ended, also written beside its raw output."""
    _, err = spy.communicate(timeout=60)
    if spy.returncode or not raw.exists():
        last = (err.strip().splitlines() or ["no output"])[-1]
        print(f"daemon_cpu: py-spy failed ({spy.returncode}): {last}", file=sys.stderr)
        return {}
    summary = summarise_py_spy(raw.read_text().splitlines())
    raw.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return summary


def live(
    seconds: float,
    probes: str,
    profile_dir: str = "",
    pid: int = 0,
    pythonpath: str = "",
    py_spy: str = "",
    settle_s: float = 1.0,
    record: bool = False,
) -> dict[str, Any]:
    """One start of the daemon watching `pid` (else a feeder loop of its own); with
    `pythonpath`, the package found there first (another tree, for before/after rounds);
    with `profile_dir`, a profile per thread there: py-spy's samples when `py_spy` names it
    (py-spy.txt, and py-spy.json by thread), else one cProfile file per thread. `record`:
    the daemon records its raw events too (`run --record`, off in its defaults), which
    gives their count by kind at the recording's cost."""
    spy = None
    raw = Path(profile_dir) / f"py-spy-{'before' if pythonpath else 'this'}.txt"
    record = record or bool(profile_dir)  # a profiled run's recording goes back for `replay`
    with tempfile.TemporaryDirectory(prefix="gj-daemon-cpu-") as tmp:
        work = Path(tmp)
        feeder = None if pid else _feeder(work, seconds)
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(work / "notify"))
        notify.settimeout(0.5)
        argv = [sys.executable, "-m", "bench.daemon_cpu", "daemon",
                "" if py_spy else profile_dir, "run",
                "--quiet", "--log", str(work / "log.jsonl"), "--socket", str(work / "sock"),
                "-p", str(pid or feeder.pid)]  # type: ignore[union-attr]  # fmt: skip
        if record:
            argv += ["--record", str(work / "rec")]
        if probes:
            argv += ["--probes", probes]
        env = {**os.environ, "NOTIFY_SOCKET": str(work / "notify")}
        if pythonpath:
            env["GJ_BENCH_TREE"] = pythonpath  # taken by bench/__init__.py
            # the bench's own tree last: its gpujitter/ folder is not the package
            path = [pythonpath, env.get("PYTHONPATH", ""), str(Path(__file__).parents[1])]
            env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
        daemon = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
        try:
            ready_s = _wait_ready(notify, daemon)
            if feeder is not None:
                assert feeder.stdin is not None
                feeder.stdin.write("go\n")
                feeder.stdin.flush()
            time.sleep(settle_s)
            if py_spy and profile_dir:
                spy = _start_py_spy(py_spy, daemon.pid, seconds, raw)
            first = _daemon_status(work / "sock")
            t0, p0, th0 = time.monotonic_ns(), process_ns(daemon.pid), threads_ns(daemon.pid)
            time.sleep(seconds)
            t1, p1, th1 = time.monotonic_ns(), process_ns(daemon.pid), threads_ns(daemon.pid)
            last = _daemon_status(work / "sock")
            rss = rss_bytes(daemon.pid)
        finally:
            stopping = time.monotonic()
            daemon.send_signal(signal.SIGINT)
            daemon.wait(timeout=60)
            stop_s = time.monotonic() - stopping  # after a stay: the heap the exit meets
            if feeder is not None:
                feeder.kill()
                feeder.wait()
        kinds = _kinds(work / "rec", t0, t1) if record else Counter()
        if profile_dir:  # the run's recording, to replay the main thread's work elsewhere
            shutil.copytree(work / "rec", Path(profile_dir) / f"rec-{raw.stem.split('-')[-1]}")
    profile = _py_spy_profile(spy, raw) if spy is not None else {}
    window_ns = t1 - t0
    threads, runs = split_by_name(th0, th1)
    return {
        "window_s": window_ns / 1e9,
        "settle_s": settle_s,
        "ready_s": ready_s,
        "probes": probes or "default",
        "tree": pythonpath or "this",
        "record": record,
        "cpu_pct": 100 * (p1 - p0) / window_ns,
        "threads_pct": {k: 100 * v / window_ns for k, v in sorted(threads.items())},
        "threads_runs_per_s": {k: round(v / (window_ns / 1e9), 1) for k, v in sorted(runs.items())},
        "exited_threads_pct": 100 * max(0, p1 - p0 - sum(threads.values())) / window_ns,
        "rss_mb": rss / 1e6,
        "stop_s": stop_s,
        "events_per_s": {k: round(v / (window_ns / 1e9), 1) for k, v in kinds.most_common()},
        "daemon_counted": _window_counts(first, last, window_ns / 1e9),
        "profile_samples": {name: t["samples"] for name, t in profile.items()},
    }


def _kinds(folder: Path, t0_ns: int, t1_ns: int) -> Counter[str]:
    """Events of each kind the daemon recorded stamped inside the window [t0_ns, t1_ns)
    (CLOCK_MONOTONIC, the events' clock): counted over the whole recording, settling and
    stop included, and divided by the window, the rates came out ~2x too high."""
    from gpujitter.daemon.offline.recordings import open_recording

    return Counter(ev.KIND for ev in open_recording([folder]) if t0_ns <= ev.ts_ns < t1_ns)


def replay(path: Path) -> dict[str, Any]:
    """CPU of this process to decode the recording, and to decode and analyse it."""
    from gpujitter.daemon.analysis.pipeline import AnalysisConfig, Pipeline
    from gpujitter.daemon.offline.recordings import open_recording

    rec = open_recording([path])
    first = last = n = 0
    start = time.process_time()
    for ev in rec:
        first, last, n = first or ev.ts_ns, ev.ts_ns, n + 1
    decode_s = time.process_time() - start
    rec = open_recording([path])
    config = AnalysisConfig.from_record(rec.header.analysis)
    start = time.process_time()
    pipeline = Pipeline(rec.header.topology, config)
    for ev in rec:
        pipeline.feed(ev)
    pipeline.flush()
    both_s = time.process_time() - start
    span_s = (last - first) / 1e9
    return {
        "events": n,
        "span_s": span_s,
        "events_per_s": n / span_s if span_s else 0.0,
        "decode_us_per_event": 1e6 * decode_s / n,
        "analysis_us_per_event": 1e6 * (both_s - decode_s) / n,
        "decode_pct_of_cpu": 100 * decode_s / span_s if span_s else 0.0,
        "analysis_pct_of_cpu": 100 * (both_s - decode_s) / span_s if span_s else 0.0,
    }


def _print_live(res: dict[str, Any]) -> None:
    recorded = ", recording" if res["record"] else ""
    print(f"daemon ({res['probes']}{recorded}, tree {res['tree']}), {res['window_s']:.0f} s "
          f"window, ready in {res['ready_s']:.1f} s: {res['cpu_pct']:.2f} % of one CPU, "
          f"RSS {res['rss_mb']:.0f} MB, stopped in {res['stop_s']:.2f} s")  # fmt: skip
    runs = res["threads_runs_per_s"]
    for name, pct in sorted(res["threads_pct"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:<20} {pct:6.2f} %  {runs.get(name, 0):7.1f} runs/s")
    print(f"  {'exited threads':<20} {res['exited_threads_pct']:6.2f} %")
    counted = res["daemon_counted"]
    if counted:
        rates = ", ".join(f"{k} {v}/s" for k, v in counted["events_per_s_by_probe"].items())
        print(f"  delivered by probe: {rates}")
        print(f"  in the window: {counted['attributions']} attributions "
              f"({counted['self_inflicted']} self-inflicted), lost {counted['lost_kernel']} "
              f"in the kernel and {counted['lost_user']} in the daemon")  # fmt: skip
    if res["events_per_s"]:
        rates = ", ".join(f"{k} {v}/s" for k, v in res["events_per_s"].items())
        print(f"  recorded: {rates}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    lv = sub.add_parser("live")
    lv.add_argument("--seconds", type=float, default=60.0)
    lv.add_argument("--probes", default="")
    lv.add_argument("--json", action="store_true")
    lv.add_argument("--profile", default="", metavar="DIR", help="a profile per thread there")
    lv.add_argument(
        "--profiler",
        choices=("auto", "cprofile", "py-spy"),
        default="auto",
        help="auto: cProfile per thread where the interpreter allows one per thread (< 3.12), "
        "else py-spy (on PATH, or in a bin/ beside sys.path's entries)",
    )
    lv.add_argument("--pid", type=int, default=0, help="watch this process (no feeder loop)")
    lv.add_argument("--rounds", type=int, default=1)
    lv.add_argument(
        "--settle", type=float, default=1.0, metavar="S", help="open the window S s after READY"
    )
    lv.add_argument(
        "--record",
        choices=("no", "yes", "alternate"),
        default="no",
        help="the daemon also records its raw events (off in its defaults): their count by "
        "kind, at the recording's cost; alternate: rounds with and without, for that cost",
    )
    lv.add_argument(
        "--before",
        default="",
        metavar="PYTHONPATH",
        help="alternate rounds with the package found there (another tree)",
    )
    dm = sub.add_parser("daemon")  # how `live` starts the daemon
    dm.add_argument("profile_dir")
    dm.add_argument("argv", nargs=argparse.REMAINDER)
    rp = sub.add_parser("replay")
    rp.add_argument("path", type=Path)
    rp.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.mode == "daemon":
        run_named(args.argv, args.profile_dir)
        return
    if args.mode == "live":
        profile = str(Path(args.profile).resolve()) if args.profile else ""
        py_spy = ""
        if profile and (
            args.profiler == "py-spy" or (args.profiler == "auto" and not per_thread_cprofile())
        ):
            py_spy = find_py_spy()
            if not py_spy:
                raise SystemExit("daemon_cpu: --profile needs py-spy here (Python 3.12+ has "
                                 "one cProfile per process): pip install py-spy")  # fmt: skip
        if profile:
            Path(profile).mkdir(parents=True, exist_ok=True)
        trees = [args.before, ""] if args.before else [""]
        records = {"no": [False], "yes": [True], "alternate": [False, True]}[args.record]
        variants = [(tree, rec) for tree in trees for rec in records]
        results = []
        for k in range(args.rounds):
            for tree, rec in variants if k % 2 == 0 else variants[::-1]:
                res = live(args.seconds, args.probes, profile, args.pid, tree, py_spy,
                           args.settle, rec)  # fmt: skip
                results.append(res)
                if not args.json:
                    _print_live(res)
        if args.json:
            print(json.dumps(results, indent=1))
        return
    res = replay(args.path)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    print(f"{args.path}: {res['events']} events over {res['span_s']:.0f} s "
          f"({res['events_per_s']:.0f}/s): decode {res['decode_us_per_event']:.1f} µs/event "
          f"({res['decode_pct_of_cpu']:.2f} % of one CPU), analysis "
          f"{res['analysis_us_per_event']:.1f} µs/event "
          f"({res['analysis_pct_of_cpu']:.2f} % of one CPU)")  # fmt: skip


if __name__ == "__main__":
    main()
