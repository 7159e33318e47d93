"""Start and stop like a service (issue 12): `gpujitter run` in a fresh process, timed from
exec to READY=1 (sd_notify, sent once every probe is attached) in wall and CPU seconds, its
resident memory while it runs and at the peak, and the time from SIGTERM or SIGINT (they
alternate over rounds) to its exit; each stop is checked to have flushed (the log and trace
files closed, exit status 0) and detached every uprobe (no breakpoint left in the watched
process's copy of libcuda).

    flock /tmp/gpujitter-kernel.lock .venv/bin/python -m bench.startstop [--rounds 3] [--json]
    tools/gpu_session.sh . .gpu/bcc.tar.xz startstop     # the GPU node: its libcuda, NVML on

The daemon watches one process that has a libcuda mapped: the drills' stub (every traced
entry point, as the real one) or, with --libcuda, that file; the cuda probe attaches to it
as it would to a training job's. NVML is off unless --nvml (a GPU node). The package is
byte-compiled first, as installing it does. --maps says where the resident peak sits: the
daemon's memory by mapping at the highest of its sizes polled from exec to its stop.
--before DIR alternates rounds with the package found in DIR (another tree, byte-compiled
too), for a change's effect side by side. --cold drops the page cache before each start (a
start after boot: the compiler's libraries, the kernel headers and the package read from
disk again).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from gpujitter import daemon, probes, tui
from gpujitter.daemon.drill.build import build_stub
from gpujitter.probes.cuda import armed_sites, system_libcuda

# -P: the tree's own gpujitter/ (the CLI alone) must not shadow the package when the
# current directory is the tree (the GPU node runs from a copy of it).
GPUJITTER = [sys.executable, "-P", "-m", "gpujitter"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds of a process so far, its threads and the children it waited for (the
    ldconfig the cuda probe runs) included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK_TICKS


def status_mb(pid: int, *fields: str) -> dict[str, float]:
    """Memory fields of /proc/PID/status (VmRSS, RssAnon, ...), in MB; absent ones left out."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        head, _, rest = line.partition(":")
        if head in fields:
            out[head] = int(rest.split()[0]) / 1024
    return out


def rss_mb(pid: int) -> float:
    return status_mb(pid, "VmRSS").get("VmRSS", 0.0)


class PeakMaps:
    """Where a process's resident peak sits: its VmRSS polled every 5 ms from follow(pid)
    on and, at each new high (by 0.5 MB), its /proc/PID/smaps summed by mapping (a
    library's file name, [heap], [anon], ...). Polled from this process, so the daemon runs
    as it would; a peak between two polls is missed (ru_maxrss has the true one)."""

    def __init__(self) -> None:
        self.high, self.maps = 0.0, Counter[str]()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, pid: int) -> None:
        self._thread = threading.Thread(target=self._poll, args=(pid,), daemon=True)
        self._thread.start()

    def _poll(self, pid: int) -> None:
        while not self._done.wait(0.005):
            try:
                now = rss_mb(pid)
                if now >= self.high + 0.5:
                    self.high, self.maps = now, smaps_by_mapping(pid)
            except OSError:  # the process is gone
                return

    def stop(self) -> dict[str, Any]:
        """The highest size seen and, then, the ten largest mappings (MB)."""
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        top = {name: round(kb / 1024, 1) for name, kb in self.maps.most_common(10)}
        return {"rss_mb": round(self.high, 1), "by_mapping_mb": top}


def smaps_by_mapping(pid: int) -> Counter[str]:
    """Resident kB by mapping name: a file's base name, or the kernel's [heap], [stack],
    ..., or [anon] for a nameless one."""
    out: Counter[str] = Counter()
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head, _, rest = line.partition(" ")
        if head == "Rss:":
            out[name] += int(rest.split()[0])
        elif not head.endswith(":"):  # a mapping's first line: range perms offset dev inode [path]
            fields = line.split(maxsplit=5)
            name = fields[5].rsplit("/", 1)[-1] if len(fields) > 5 else "[anon]"
    return out


def holder(libcuda: Path) -> subprocess.Popen[str]:
    """A process with `libcuda` mapped that waits (the drills' scripted loop, no script)."""
    child = subprocess.Popen(
        [*GPUJITTER[:2], "-m", "gpujitter.daemon.drill.schedule", str(libcuda), "[]"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not armed_sites(child.pid, str(libcuda)):
        time.sleep(0.1)  # until the loader has mapped it
    return child


def start_daemon(
    tmp: Path,
    watched: int,
    flags: list[str],
    peak: PeakMaps | None = None,
    pythonpath: str = "",
) -> tuple[subprocess.Popen[bytes], float]:
    """`gpujitter run` watching `watched`, with an empty configuration and `flags`; returns
    once it said READY=1 (sd_notify), with the seconds from exec to then. `peak` follows
    it from its exec on; `pythonpath`: the package found there first (another tree)."""
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    (tmp / "notify").unlink(missing_ok=True)
    notify.bind(str(tmp / "notify"))
    notify.settimeout(120)
    (tmp / "empty.toml").touch()  # not this node's /etc/gpujitter/gpujitter.toml
    cmd = [*GPUJITTER, "run", "--config", str(tmp / "empty.toml"), "--pid", str(watched),
           "--socket", str(tmp / "gj.sock"), *flags]  # fmt: skip
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp / "notify")}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    started = time.monotonic()
    daemon = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
    if peak is not None:
        peak.follow(daemon.pid)
    try:
        said = notify.recv(4096).decode()
        if not said.startswith("READY=1"):
            raise RuntimeError(f"daemon said {said!r} before READY=1")
    except BaseException:
        daemon.kill()
        daemon.wait()
        raise
    finally:
        notify.close()
    return daemon, time.monotonic() - started


def one_round(
    tmp: Path,
    watched: int,
    libcuda: Path,
    stop: signal.Signals,
    args: argparse.Namespace,
    tree: str = "",
) -> dict[str, Any]:
    log, trace = tmp / "attr.jsonl", tmp / f"trace-{time.monotonic_ns()}"
    flags = ["--log", str(log), "--record", str(trace)]
    flags += [] if args.nvml else ["--no-nvml"]
    flags += ["--probes", args.probes] if args.probes else []
    if args.cold:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    peak = PeakMaps() if args.maps else None  # its poll ends with the process
    daemon, ready_s = start_daemon(tmp, watched, flags, peak, tree)
    try:
        ready_cpu_s = cpu_s(daemon.pid)
        rss: list[float] = []
        armed = 0
        steady_until = time.monotonic() + args.steady_s
        while time.monotonic() < steady_until:
            time.sleep(0.25)
            rss.append(rss_mb(daemon.pid))
            armed = max(armed, sum(armed_sites(watched, str(libcuda)).values()))
        stopped = time.monotonic()
        daemon.send_signal(stop)
        _, status, usage = os.wait4(daemon.pid, 0)
        stop_s = time.monotonic() - stopped
        daemon.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if daemon.returncode is None:
            daemon.kill()
            daemon.wait()
    at_peak = {"rss_peak_at": peak.stop()} if peak is not None else {}
    return at_peak | {
        "tree": tree or "this",
        "signal": stop.name,
        "ready_s": ready_s,
        "ready_cpu_s": ready_cpu_s,
        "rss_steady_mb": statistics.median(rss),
        "rss_steady_max_mb": max(rss),
        "rss_peak_mb": usage.ru_maxrss / 1024,
        "stop_s": stop_s,
        "exit_status": daemon.returncode,
        "uprobes_while_running": armed,
        "uprobes_after_stop": sum(armed_sites(watched, str(libcuda)).values()),
        "trace_files": len(list(trace.glob("*"))),
        "log_closed": log.exists(),
    }


def compile_bytecode(pythonpath: str = "") -> None:
    """Byte-compile the package, as installing it does: a fresh process then reads .pyc
    files instead of compiling ~80 modules (0.4 CPU-s here), even where
    PYTHONDONTWRITEBYTECODE keeps Python from writing them itself. `pythonpath`: the
    package found there (another tree) instead of this process's."""
    import gpujitter
    import gpujitter.cli

    # Each folder by itself: compileall does not follow linked folders, which the GPU
    # node's package trees are made of (tools/gpu_session.sh).
    if pythonpath:
        root = Path(pythonpath, "gpujitter")
        folders = [root, *(p for p in root.iterdir() if p.is_dir())]
    else:
        folders = [Path(str(p.__file__)).parent for p in (gpujitter, gpujitter.cli, probes,
                                                         daemon, tui)]  # fmt: skip
    for folder in folders:
        compileall.compile_dir(folder, quiet=1)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    compile_bytecode()
    trees = [args.before, ""] if args.before else [""]
    if args.before:
        compile_bytecode(args.before)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        if args.libcuda == "system":
            found = system_libcuda()
            if not found:
                raise SystemExit("bench.startstop: no libcuda on this node (--libcuda system)")
            libcuda = Path(found[0])
        else:
            libcuda = Path(args.libcuda) if args.libcuda else build_stub(tmp)
        child = holder(libcuda)
        sites = len(armed_sites(child.pid, str(libcuda)))
        try:
            stops = (signal.SIGTERM, signal.SIGINT)
            rounds = [
                one_round(tmp, child.pid, libcuda, stops[i % 2], args, tree)
                for i in range(args.rounds)
                for tree in (trees if i % 2 == 0 else trees[::-1])
            ]
        finally:
            child.kill()
            child.wait()
    result = summary([r for r in rounds if r["tree"] == "this"])
    if args.before:
        result["before"] = summary([r for r in rounds if r["tree"] != "this"])
    result |= {"libcuda": str(args.libcuda or "stub"), "traced_functions": sites}
    return {"rounds": rounds, **result}


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("ready_s", "ready_cpu_s", "rss_steady_mb", "rss_peak_mb", "stop_s")
    return {
        "median": {k: statistics.median(r[k] for r in rounds) for k in keys},
        "max": {k: max(r[k] for r in rounds) for k in keys},
    }


def report(r: dict[str, Any]) -> str:
    lines = [f"libcuda {r['libcuda']}: {r['traced_functions']} traced functions"]
    lines += [
        "round  tree    signal   ready s  ready CPU-s  RSS steady/peak MB  stop s  "
        "uprobes run/after  exit"
    ]
    for i, x in enumerate(r["rounds"], start=1):
        lines.append(
            f"{i:5}  {'this' if x['tree'] == 'this' else 'before':6}  {x['signal']:7}  "
            f"{x['ready_s']:7.2f}  {x['ready_cpu_s']:11.2f}  "
            f"{x['rss_steady_mb']:8.0f} / {x['rss_peak_mb']:<7.0f}  {x['stop_s']:6.2f}  "
            f"{x['uprobes_while_running']:7} / {x['uprobes_after_stop']:<7}  {x['exit_status']}"
        )
        if "rss_peak_at" in x:
            at = x["rss_peak_at"]
            parts = ", ".join(f"{k} {v:.0f}" for k, v in at["by_mapping_mb"].items())
            lines.append(f"       at {at['rss_mb']:.0f} MB: {parts}")
    for label, part in (("before", r.get("before")), ("this", r)):
        if part is not None:
            lines.append(median_line(label, part))
    return "\n".join(lines)


def median_line(label: str, r: dict[str, Any]) -> str:
    m, top = r["median"], r["max"]
    return (
        f"{label} median: ready {m['ready_s']:.2f} s, {m['ready_cpu_s']:.2f} CPU-s; "
        f"RSS {m['rss_steady_mb']:.0f} MB steady, {m['rss_peak_mb']:.0f} MB peak; "
        f"stop {m['stop_s']:.2f} s"
        f" (max {top['stop_s']:.2f} s; targets: ready <= 3 s and 3 CPU-s, stop <= 2 s,"
        " RSS <= 150 / 200 MB)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--steady-s", type=float, default=5.0, help="run time between ready and stop"
    )
    parser.add_argument(
        "--libcuda",
        help="the libcuda the watched process maps: a path, or 'system' (the driver's); "
        "default: the drills' stub",
    )
    parser.add_argument("--nvml", action="store_true", help="let the daemon open NVML")
    parser.add_argument(
        "--maps", action="store_true", help="the memory by mapping at the resident peak"
    )
    parser.add_argument(
        "--cold", action="store_true", help="drop the page cache before each start (root)"
    )
    parser.add_argument(
        "--before",
        default="",
        metavar="PYTHONPATH",
        help="alternate rounds with the package found there (another tree)",
    )
    add_daemon_args(parser)
    args = parser.parse_args(argv)
    result = measure(args)
    say(args, result, report(result))
    return 0


def add_daemon_args(parser: argparse.ArgumentParser) -> None:
    """The options of a bench that runs the daemon: its probes, and where the result goes."""
    parser.add_argument("--probes", default="", help="--probes for the daemon (default set)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the JSON result there")


def say(args: argparse.Namespace, result: dict[str, Any], text: str) -> None:
    """The result as JSON (--json) or `text`, and as JSON into --out."""
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1) if args.json else text)


if __name__ == "__main__":
    raise SystemExit(main())
