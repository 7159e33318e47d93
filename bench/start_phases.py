"""Where `gpujitter run`'s start goes, phase by phase: the wall time since exec and the
process's CPU time (all its threads) at each boundary, in a child process whose functions
are wrapped to mark them; the figures of bench/startstop.py's "ready", split.

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.start_phases [--rounds 3] [--json]

Phases: python and the imports (to the daemon's construction), the daemon's construction
(settings checked, the probe modules, the topology), the runtime's start up to the compile
(its scheduling, NVML), the one bcc compile (where `run` started it ahead: the wait for it),
attaching (probes, the core's first /proc scan), then the sinks and READY; and, where the
tree has it, the compile ahead on its own thread and the time to its start (python, the
CLI, the settings, the module's text). A module is marked once the program imports it, so
the imports stay where the program makes them. At each boundary the resident peak so far
(VmHWM) is taken too: the phase whose end first shows the peak holds it. The daemon watches
this process, NVML off (--nvml: on), and is stopped by SIGINT a second after READY. The
package is byte-compiled first, as bench/startstop.py does (as installing it does).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

# (label, module, class or "", function): each call's start and end are marked.
WRAPPED = (
    ("daemon", "gpujitter.daemon.service.service", "Daemon", "__init__"),
    ("compile", "gpujitter.probes.bundle", "Bundle", "_compile"),
    ("ahead", "gpujitter.probes.bundle", "_Ahead", "run"),
    ("probes", "gpujitter.probes.runner", "ProbeSet", "start"),
    ("ready", "gpujitter.daemon.service.sdnotify", "Notifier", "ready"),
)
# phase -> (from mark, to mark); "exec" is the child's exec.
PHASES = {
    "to the compile ahead": ("exec", "ahead<"),
    "imports": ("exec", "daemon<"),
    "daemon": ("daemon<", "daemon>"),
    "to compile": ("daemon>", "compile<"),
    "compile": ("compile<", "compile>"),
    "compile ahead": ("ahead<", "ahead>"),
    "attach": ("compile>", "probes>"),
    "sinks, READY": ("probes>", "ready<"),
}


def peak_mb() -> float:
    """The process's resident peak so far (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def child(argv: list[str], marks_path: str) -> None:
    """`gpujitter ARGV` in this process with the WRAPPED functions marking their calls."""
    import importlib.abc
    import importlib.machinery

    t0 = int(os.environ["GJ_EXEC_NS"])
    marks: dict[str, tuple[float, float]] = {}

    def mark(name: str) -> None:
        if name not in marks:  # the first call of each
            marks[name] = ((time.monotonic_ns() - t0) / 1e6, time.process_time() * 1e3,
                           peak_mb())  # fmt: skip

    def wrap(label: str, owner: Any, fn: str) -> None:
        original = getattr(owner, fn)

        @functools.wraps(original)
        def marked(*args: Any, **kwargs: Any) -> Any:
            mark(label + "<")
            try:
                return original(*args, **kwargs)
            finally:
                mark(label + ">")
                if label == "ready":
                    threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()

        setattr(owner, fn, marked)

    # Each module is wrapped once the program imports it (importing them here would move
    # the imports ahead of the start, where `run` overlaps them with the compile).
    waiting: dict[str, list[tuple[str, str, str]]] = {}
    for label, module, cls, fn in WRAPPED:
        waiting.setdefault(module, []).append((label, cls, fn))

    class Marker(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name not in waiting:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path, target)
            for finder in sys.meta_path:
                if spec is None and finder is not self and hasattr(finder, "find_spec"):
                    spec = finder.find_spec(name, path, target)
            if spec is None or spec.loader is None:
                return spec
            loader, wrapped = spec.loader, waiting.pop(name)
            exec_module = loader.exec_module

            def exec_and_wrap(module: Any) -> None:
                exec_module(module)
                for label, cls, fn in wrapped:
                    owner = getattr(module, cls, None)
                    if owner is not None:  # a tree without it (the compile ahead, before it)
                        wrap(label, owner, fn)

            loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Marker())
    sys.argv = ["gpujitter", *argv]
    try:
        runpy.run_module("gpujitter", run_name="__main__")
    except SystemExit:
        pass
    finally:
        Path(marks_path).write_text(json.dumps(marks))


def one_round(flags: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="gj-phases-") as tmp:
        marks_path = f"{tmp}/marks.json"
        argv = [sys.executable, "-P", "-m", "bench.start_phases", "child", marks_path, "run",
                "--quiet", "--pid", str(os.getpid()), "--socket", f"{tmp}/sock",
                "--log", f"{tmp}/log.jsonl", *flags]  # fmt: skip
        env = {**os.environ, "GJ_EXEC_NS": str(time.monotonic_ns()), "NOTIFY_SOCKET": ""}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (env.get("PYTHONPATH", ""), str(Path(__file__).parents[1])) if p
        )
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True, timeout=120)
        marks = json.loads(Path(marks_path).read_text())
    marks["exec"] = (0.0, 0.0, 0.0)
    return {
        phase: {
            "wall_ms": marks[b][0] - marks[a][0],
            "cpu_ms": marks[b][1] - marks[a][1],
            "peak_mb": marks[b][2],
        }
        for phase, (a, b) in PHASES.items()
        if a in marks and b in marks
    } | {"ready": dict(zip(("wall_ms", "cpu_ms", "peak_mb"), marks["ready<"], strict=True))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode")
    ch = sub.add_parser("child")  # how a round starts the daemon
    ch.add_argument("marks")
    ch.add_argument("argv", nargs=argparse.REMAINDER)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nvml", action="store_true")
    parser.add_argument("--probes", default="")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.mode == "child":
        child(args.argv, args.marks)
        return
    from bench.startstop import compile_bytecode

    compile_bytecode()
    flags = [] if args.nvml else ["--no-nvml"]
    flags += ["--probes", args.probes] if args.probes else []
    rounds = [one_round(flags) for _ in range(args.rounds)]
    if args.json:
        print(json.dumps(rounds, indent=1))
        return
    print(f"{'phase':<20} {'wall ms (median, range)':>26} {'CPU ms (median, range)':>26}"
          f" {'peak MB at its end':>20}")  # fmt: skip
    for phase in [*PHASES, "ready"]:
        cells = []
        if any(phase not in r for r in rounds):
            continue
        for key in ("wall_ms", "cpu_ms"):
            values = [r[phase][key] for r in rounds]
            cells.append(
                f"{statistics.median(values):7.0f} ({min(values):5.0f}-{max(values):5.0f})"
            )
        peak = statistics.median(r[phase]["peak_mb"] for r in rounds)
        print(f"{phase:<20} {cells[0]:>26} {cells[1]:>26} {peak:>20.0f}")


if __name__ == "__main__":
    main()
