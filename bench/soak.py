"""Soak and fault suite for `gpujitter run`: the real daemon under every abuse at once (slow,
stuck and spamming stream clients, metrics scrapes and connection floods, a disk that fills
and frees, SIGHUP rotations, SIGKILLs, SIGTERMs at random moments) for a given time; fails
(exit 1) on any lost record, leak, loop stall, slow exit or traceback. Root, bcc, gcc.

    .venv/bin/python -m bench.soak --minutes 30 --json out.json     (make soak)

Accounting, per daemon lifetime (from spawn to exit):
- ended by SIGTERM: the daemon's final `daemon.status` on the stream (published after the
  last attribution, before the socket closes) says how many attributions it made
  (`attributions`) and how many its log dropped (`log_dropped`); the `gpu.attribution` lines
  the log got in that lifetime (read by a tailer that follows renames) must equal
  attributions - log_dropped, and no attribution a stream client saw may be missing from the
  log beyond log_dropped.
- ended by SIGKILL: every log line parses and type-checks, at least (attributions -
  log_dropped) of the last status seen are in the log, and every trace file reads back.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import random
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpujitter.signals import STOPPED_WHILE_STARTING

REPO = Path(__file__).resolve().parent.parent
GPUJITTER = Path(sys.executable).with_name("gpujitter")
FEED_COMM = "gjsoak-feed"  # the daemon watches the feeding loop by this name
WATCHDOG_USEC = 2_000_000  # the daemon pings every 1 s (half of it)
STALL_LIMIT_S = 2.0  # a loop stall: pings further apart than the interval plus this
EXIT_LIMIT_S = 2.0  # SIGTERM -> exit
RSS_GROWTH_LIMIT_BYTES = 10 << 20  # growth over the measured window (rss_growth)
READY_TIMEOUT_S = 180.0  # spawn -> READY=1 (bcc compiles the probes; a loaded node is slow)
DISK_BYTES = 8 << 20  # the tmpfs that holds the log and the recordings
# Small rotations so that the disk fills and files turn over within minutes; a small stream
# queue so that the stuck clients' backlogs reach their bound within the RSS warm-up.
CONFIG = """
[socket]
queue = 256
[log]
max_bytes = 262144
keep = 3
[record]
max_bytes = 1048576
keep = 2
"""
CLIENT_KINDS = ("fast", "slow", "stuck", "snapshot", "churn")


@dataclass(frozen=True, slots=True)
class Plan:
    """What one run does; the short run and the 30-minute soak differ only here."""

    seconds: float
    clients: int = 50
    kills: int = 20
    terms: int = 5  # SIGTERMs at random moments (the run's last stop is one more)
    hup_every_s: float = 45.0
    flood_every_s: float = 120.0
    fill_every_s: float = 90.0  # one disk cycle: fill, hold full for half, free
    feed_segment_s: float = 120.0  # the feeding loop restarts this often
    stall_every_s: float = 0.5
    stall_ms: float = 30.0
    # Of the long first lifetime, before RSS is measured: what fills at the plan's rates
    # is full by then. The snapshot that every client's first messages carry (and the
    # snapshot clients ask for each second) grows to ~310 KB with the daemon's 200 recent
    # gaps and attributions (one of each per stall: 100 s), and 20 clients hold one or two
    # unsent: READY (<= 30 s) + 100 s + the analysis' 60 s histories, rounded up. What may
    # still come is bounded within the limit: the console's queue (1000 lines, stdout
    # unread) fills in ~9 minutes but holds ~1 MiB; a main-loop stall's event backlog (at
    # most the daemon's 16384-event queue, ~7 MiB, which Python keeps once drained) can
    # come at any moment.
    warmup_s: float = 200.0
    exit_limit_s: float = EXIT_LIMIT_S  # SIGTERM -> exit, the service's target
    seed: int = 1

    @classmethod
    def short(cls, seconds: float = 100.0) -> Plan:
        return cls(
            seconds=seconds,
            kills=2,
            terms=2,
            hup_every_s=12.0,
            flood_every_s=25.0,
            fill_every_s=20.0,
            feed_segment_s=30.0,
            warmup_s=25.0,
            # In `make test` (beside other tests on 2 CPUs) the stop is checked for a hang;
            # the 2 s target is the 30-minute soak's, where it is measured and reported.
            exit_limit_s=10.0,
        )


def now() -> float:
    return time.monotonic()


# -- the feeding loop ------------------------------------------------------------------


def feed_main(cfg_json: str) -> None:
    """The drills' feeding loop under the name the daemon watches (`python -m bench.soak
    feed CONFIG`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, FEED_COMM.encode(), 0, 0, 0)  # PR_SET_NAME: the process's comm
    from gpujitter.daemon.drill import feeder

    sys.argv = [sys.argv[0], cfg_json]
    feeder.main()


class FeedLoop(threading.Thread):
    """Runs the drill's feeding loop on the stub libcuda with a stall every stall_every_s
    (a CPU-bound host step the daemon attributes), one segment after another."""

    def __init__(self, plan: Plan, stop: threading.Event) -> None:
        super().__init__(name="soak-feed", daemon=True)
        from gpujitter.daemon.drill.build import cached_inject, cached_stub

        self.plan, self.stop = plan, stop
        self.stub, self.inject = str(cached_stub()), str(cached_inject())
        self.segments = 0
        self.stalls = 0
        self.errors: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def _config(self) -> str:
        from gpujitter.daemon.drill.feeder import FeederConfig

        p = self.plan
        n = int((p.feed_segment_s - 2) / p.stall_every_s)
        return FeederConfig(
            backend="stub",
            inject_lib=self.inject,
            scenario="compute",
            cpu=max(os.sched_getaffinity(0)),
            duration_s=p.feed_segment_s,
            stall_ms=p.stall_ms,
            stall_at_s=tuple(1 + k * p.stall_every_s for k in range(n)),
            stub=self.stub,
        ).to_json()

    def run(self) -> None:
        while not self.stop.is_set():
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.soak", "feed", self._config()],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self.proc = proc
            assert proc.stdin is not None and proc.stdout is not None
            try:
                if "ready" not in json.loads(proc.stdout.readline() or "{}"):
                    self.errors.append(f"feeding loop did not start (status {proc.wait()})")
                    self.stop.wait(5)
                    continue
                proc.stdin.write("go\n")
                proc.stdin.flush()
                for line in proc.stdout:
                    self.stalls += "stall" in json.loads(line)
                self.segments += 1
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()


# -- what the daemon says: sd_notify, the log, the stream ------------------------------


# Linux's SO_TIMESTAMPNS (= SCM_TIMESTAMPNS), which Python's socket module does not name.
SO_TIMESTAMPNS = 35


class NotifyListener(threading.Thread):
    """The datagram socket the daemon's sd_notify goes to: READY, WATCHDOG, RELOADING,
    STOPPING, each stamped with the sender's pid (SO_PASSCRED) and with when the kernel
    queued it (SO_TIMESTAMPNS), not when this thread got to read it: a listener held up
    (one of the soak's many threads) must not read as a stalled daemon."""

    def __init__(self, path: Path) -> None:
        super().__init__(name="soak-notify", daemon=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.messages: list[tuple[float, int, str]] = []
        self.cond = threading.Condition()
        # The kernel's stamp is wall time; the soak's clock is monotonic.
        self.wall_minus_mono = time.time() - now()

    def run(self) -> None:
        size = socket.CMSG_SPACE(12) + socket.CMSG_SPACE(16)
        while True:
            try:
                data, anc, _, _ = self.sock.recvmsg(4096, size)
            except OSError:
                return
            pid, at = 0, now()
            for level, kind, raw in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = int.from_bytes(raw[:4], "little")
                elif level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                    sec, nsec = (
                        int.from_bytes(raw[:8], "little"),
                        int.from_bytes(raw[8:16], "little"),
                    )
                    at = sec + nsec / 1e9 - self.wall_minus_mono
            with self.cond:
                for line in data.decode(errors="replace").splitlines():
                    self.messages.append((at, pid, line))
                self.cond.notify_all()

    def wait_for(self, pid: int, text: str, timeout_s: float) -> bool:
        deadline = now() + timeout_s
        with self.cond:
            while not any(p == pid and m == text for _, p, m in self.messages):
                left = deadline - now()
                if left <= 0:
                    return False
                self.cond.wait(left)
        return True

    def of(self, pid: int, text: str) -> list[float]:
        with self.cond:
            return [t for t, p, m in self.messages if p == pid and m == text]


class LogTailer:
    """Follows the attribution log as a shipper would: reads whole lines from the open file,
    and when the path names another file (the daemon rotated it, or we renamed it for a
    SIGHUP) reads the old one to its end first. Every line is parsed and type-checked."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.ino = 0
        self.buf = b""
        self.attributions: list[tuple[int, int, int]] = []  # (gpu, ts_ns, end_ns)
        self.dropped_records = 0  # the counts of log.dropped records
        self.bad: list[str] = []
        self.lines = 0
        self.done_files: list[int] = []  # inodes read to the end (renamed away)

    def _open(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        self.fd, self.ino, self.buf = fd, os.fstat(fd).st_ino, b""

    def _read_all(self) -> None:
        assert self.fd is not None
        while chunk := os.read(self.fd, 1 << 16):
            self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        from gpujitter.daemon.sinks.jsonlog import DROPPED, LOG_SCHEMA
        from gpujitter.probes.events import BadRecord, event_kinds, from_record

        self.lines += 1
        try:
            rec = orjson.loads(line)
            if rec.get("schema") != LOG_SCHEMA:
                raise ValueError(f"schema {rec.get('schema')!r}")
            if rec.get("type") in event_kinds():
                from_record(rec)
        except (orjson.JSONDecodeError, ValueError, BadRecord, AttributeError) as err:
            self.bad.append(f"{line[:80]!r}: {err}")
            return
        if rec["type"] == "gpu.attribution":
            self.attributions.append((rec["gpu"], rec["ts_ns"], rec["end_ns"]))
        elif rec["type"] == DROPPED:
            self.dropped_records += rec["count"]

    def poll(self) -> None:
        """Read what is new; follow a rename. A torn tail stays in the buffer: the daemon's
        next open cuts it off, and the tailer then reads on from the same offset."""
        if self.fd is None:
            self._open()
            if self.fd is None:
                return
        self._read_all()
        try:
            current = os.stat(self.path).st_ino
        except FileNotFoundError:
            current = 0
        if current and current != self.ino:
            self._read_all()
            if self.buf:
                self.bad.append(f"rotated-away file ends in a torn line {self.buf[:80]!r}")
            os.close(self.fd)
            self.done_files.append(self.ino)
            self.fd = None
            self._open()
            if self.fd is not None:
                self._read_all()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def connect_unix(path: Path, timeout_s: float = 2.0) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        return None
    return sock


class Auditor(threading.Thread):
    """One stream client that reads everything at once and keeps, per daemon pid, the
    attributions it saw live, the last `daemon.status`, and whether it was ever told it
    lost records."""

    def __init__(self, path: Path, stop: threading.Event) -> None:
        super().__init__(name="soak-auditor", daemon=True)
        self.path, self.stop = path, stop
        self.seen: dict[int, list[tuple[int, int, int]]] = {}
        self.status: dict[int, dict[str, Any]] = {}
        self.seen_at_status: dict[int, int] = {}  # attributions seen before the last status
        self.dropped: dict[int, int] = {}
        self.closed: set[int] = set()  # daemons whose connection ended (all read)
        self.refused = 0

    def run(self) -> None:
        while not self.stop.is_set():
            sock = connect_unix(self.path)
            if sock is None:
                self.stop.wait(0.2)
                continue
            with sock:
                self._read(sock)

    def _read(self, sock: socket.socket) -> None:
        sock.settimeout(1.0)
        buf, pid = b"", 0
        while not self.stop.is_set():
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return
            if not chunk:
                self.closed.add(pid)
                return
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                rec = orjson.loads(line)
                kind = rec.get("type")
                if kind == "hello":
                    pid = rec["pid"]
                elif kind == "error":
                    self.refused += 1
                    self.stop.wait(0.1)
                    return
                elif kind == "gpu.attribution":
                    key = (rec["gpu"], rec["ts_ns"], rec["end_ns"])
                    self.seen.setdefault(pid, []).append(key)
                elif kind == "daemon.status":
                    self.status[pid] = rec
                    self.seen_at_status[pid] = len(self.seen.get(pid, ()))
                elif kind == "dropped":
                    self.dropped[pid] = rec["total"]


class StreamClient(threading.Thread):
    """A stream client of one kind: fast (reads all), slow (a little now and then), stuck
    (never reads), snapshot (asks for a snapshot every 50 ms), churn (comes and goes)."""

    def __init__(self, path: Path, kind: str, stop: threading.Event, rng: random.Random):
        super().__init__(name=f"soak-client-{kind}", daemon=True)
        self.path, self.kind, self.stop, self.rng = path, kind, stop, rng
        self.connections = 0
        self.bytes = 0

    def run(self) -> None:
        while not self.stop.is_set():
            sock = connect_unix(self.path)
            if sock is None:
                self.stop.wait(0.3 + self.rng.random())
                continue
            self.connections += 1
            with sock:
                sock.setblocking(False)
                with contextlib.suppress(OSError):
                    getattr(self, f"_{self.kind}")(sock)
            self.stop.wait(self.rng.uniform(0.2, 1.0))  # back off, as a real client would

    def _recv(self, sock: socket.socket, limit: int, wait_s: float) -> bool:
        """Read up to `limit` bytes within wait_s; False once the daemon closed it."""
        ready, _, _ = select.select([sock], [], [], wait_s)
        if not ready:
            return True
        data = sock.recv(limit)
        self.bytes += len(data)
        return bool(data)

    def _fast(self, sock: socket.socket) -> None:
        while not self.stop.is_set() and self._recv(sock, 1 << 16, 0.5):
            pass

    def _slow(self, sock: socket.socket) -> None:
        while not self.stop.is_set() and self._recv(sock, 1024, 0.05):
            self.stop.wait(0.5)

    def _stuck(self, sock: socket.socket) -> None:
        poller = select.poll()
        poller.register(sock, select.POLLRDHUP)
        while not self.stop.is_set() and not poller.poll(500):
            pass  # until the daemon goes away

    def _snapshot(self, sock: socket.socket) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(BlockingIOError):
                sock.send(b'{"cmd": "snapshot"}\n')
            if not self._recv(sock, 1 << 16, 0.05):
                return

    def _churn(self, sock: socket.socket) -> None:
        end = now() + self.rng.uniform(0.1, 3.0)
        if self.rng.random() < 0.5:
            sock.send(b'{"cmd": "ping"}\n' if self.rng.random() < 0.5 else b"nonsense\n")
        while now() < end and self._recv(sock, 4096, 0.1):
            pass


class Scraper(threading.Thread):
    """GET /metrics every second; counts answers and failures while the daemon is ready."""

    def __init__(self, port: int, stop: threading.Event, up: Callable[[], bool]) -> None:
        super().__init__(name="soak-scraper", daemon=True)
        self.port, self.stop, self.up = port, stop, up
        self.ok = 0
        self.failed: list[str] = []
        self.slowest_s = 0.0

    def run(self) -> None:
        while not self.stop.wait(1.0):
            was_up = self.up()
            t0 = now()
            try:
                body = http_get(self.port)
                ok = b"gpujitter_stream_clients" in body
            except OSError as err:
                ok, body = False, str(err).encode()
            if ok:
                self.ok += 1
                self.slowest_s = max(self.slowest_s, now() - t0)
            elif was_up and self.up():
                self.failed.append(body[:100].decode(errors="replace"))


def http_get(port: int, timeout_s: float = 3.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: soak\r\n\r\n")
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    if not data.startswith(b"HTTP/1.1 200"):
        raise OSError(f"answer {data[:40]!r}")
    return data


def flood(port: int, sock_path: Path, stop: threading.Event) -> dict[str, int]:
    """A bounded connection flood: 100 TCP connections to the metrics port (idle, or sending
    half a request), 100 to the stream socket (never reading), held 6 s, then closed."""
    opened = {"metrics": 0, "socket": 0}
    socks: list[socket.socket] = []
    try:
        for k in range(100):
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            tcp.setblocking(False)
            with contextlib.suppress(BlockingIOError, OSError):
                tcp.connect(("127.0.0.1", port))
            socks.append(tcp)
            opened["metrics"] += 1
            if k % 2:
                with contextlib.suppress(OSError):
                    tcp.send(b"GET /metr")
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            unix.setblocking(False)
            try:
                unix.connect(str(sock_path))
                opened["socket"] += 1
            except OSError:
                pass
            socks.append(unix)
        stop.wait(6.0)
    finally:
        for s in socks:
            s.close()
    return opened


# -- the disk ---------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(where: Path, size_bytes: int) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "soak", where], check=True
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(path: Path) -> int:
    """Write `path` until the disk says no; returns the bytes it took."""
    block = b"\0" * (64 << 10)
    done = 0
    with open(path, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            done += f.write(block) or 0
    return done


# -- the daemon -------------------------------------------------------------------------


@dataclass(slots=True)
class Lifetime:
    pid: int
    started_s: float
    ready_s: float | None = None  # spawn -> READY=1
    end: str = ""  # "sigterm", "sigkill", "died"
    signal_at_s: float | None = None  # since READY (negative: before it)
    exit_s: float | None = None  # SIGTERM -> reaped
    status: int | None = None
    watchdog_pings: int = 0
    max_ping_gap_s: float = 0.0
    reloads: int = 0
    produced: int | None = None  # final daemon.status: attributions
    log_dropped: int | None = None
    trace_lost: int | None = None
    logged: int = 0
    dropped_records: int = 0  # log.dropped counts written in this lifetime
    streamed: int = 0
    stream_missing: int = 0  # seen on the stream, not in the log
    unaccounted: int | None = None
    traces_read: int = 0
    trace_problems: list[str] = field(default_factory=list)
    samples: list[tuple[float, int, int, int]] = field(default_factory=list)  # t, rss, thr, fd
    problems: list[str] = field(default_factory=list)


class Daemon:
    """Spawns `gpujitter run` (under WATCHDOG_PID=$$, so the pid it is told is its own)."""

    def __init__(self, work: Path, disk: Path, port: int, notify: NotifyListener) -> None:
        self.work, self.disk, self.port, self.notify = work, disk, port, notify
        self.log = disk / "attributions.jsonl"
        self.record = disk / "traces"
        self.socket = work / "gj.sock"
        self.config = work / "soak.toml"
        self.config.write_text(CONFIG)
        self.stderr = open(work / "daemon.stderr", "ab")  # noqa: SIM115 (closed in close)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready = False

    def spawn(self) -> Lifetime:
        args = [
            str(GPUJITTER),
            "run",
            "--json",
            "--no-nvml",
            "--no-gpu-processes",
            "--config",
            str(self.config),
            "--comm",
            FEED_COMM,
            "--log",
            str(self.log),
            "--record",
            str(self.record),
            "--socket",
            str(self.socket),
            "--metrics",
            f"127.0.0.1:{self.port}",
        ]
        env = {
            **os.environ,
            "NOTIFY_SOCKET": str(self.work / "notify"),
            "WATCHDOG_USEC": str(WATCHDOG_USEC),
        }
        # stdout is a pipe nobody reads: a stuck terminal must not stop the daemon.
        self.proc = subprocess.Popen(
            ["sh", "-c", 'WATCHDOG_PID=$$ exec "$@"', "sh", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            stdin=subprocess.DEVNULL,
        )
        self.ready = False
        return Lifetime(pid=self.proc.pid, started_s=now())

    def wait_ready(self, life: Lifetime, timeout_s: float = READY_TIMEOUT_S) -> bool:
        deadline = now() + timeout_s
        assert self.proc is not None
        while now() < deadline and self.proc.poll() is None:
            if self.notify.wait_for(life.pid, "READY=1", 0.5):
                life.ready_s = now() - life.started_s
                self.ready = True
                return True
        life.problems.append(
            "never ready"
            if self.proc.poll() is None
            else f"exited before ready (status {self.proc.returncode})"
        )
        return False

    def stop(self, life: Lifetime, sig: int) -> None:
        assert self.proc is not None
        t0 = now()
        if life.ready_s is not None:
            life.signal_at_s = t0 - life.started_s - life.ready_s
        self.ready = False
        self.proc.send_signal(sig)
        try:
            life.status = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            life.problems.append("still running 60 s after the signal: killed")
            self.proc.kill()
            life.status = self.proc.wait()
        life.end = "sigkill" if sig == signal.SIGKILL else "sigterm"
        if sig == signal.SIGTERM:
            life.exit_s = now() - t0
            if life.ready_s is None:
                life.end = "sigterm-early"  # before READY: stopped at once, or once attached
            early = (0, STOPPED_WHILE_STARTING)
            if life.status not in (early if life.ready_s is None else (0,)):
                life.problems.append(f"exit status {life.status} after SIGTERM")
        assert self.proc.stdout is not None
        self.proc.stdout.close()

    def sample(self, life: Lifetime) -> None:
        try:
            text = Path(f"/proc/{life.pid}/status").read_text()
            fds = len(os.listdir(f"/proc/{life.pid}/fd"))
        except OSError:
            return
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        rss = int(fields["VmRSS"].split()[0]) * 1024
        life.samples.append((now(), rss, int(fields["Threads"]), fds))

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


# -- checks -----------------------------------------------------------------------------


def check_watchdog(life: Lifetime, notify: NotifyListener) -> None:
    pings = notify.of(life.pid, "WATCHDOG=1")
    life.watchdog_pings = len(pings)
    life.reloads = len(notify.of(life.pid, "RELOADING=1"))
    ready = notify.of(life.pid, "READY=1")
    if not ready:
        return
    stopping = notify.of(life.pid, "STOPPING=1")
    # From READY until the stop began (STOPPING=1, or the signal for a SIGKILL).
    times = [ready[0], *pings]
    if life.end == "sigkill" and life.signal_at_s is not None:
        times.append(life.started_s + (life.ready_s or 0) + life.signal_at_s)
    elif stopping:
        times.append(stopping[0])
    gaps = [(b - a, a - times[0]) for a, b in itertools.pairwise(times)]
    life.max_ping_gap_s, at_s = max(gaps, default=(0.0, 0.0))
    interval_s = WATCHDOG_USEC / 2e6
    if life.max_ping_gap_s > interval_s + STALL_LIMIT_S:
        life.problems.append(f"main loop stalled: {life.max_ping_gap_s:.2f} s between pings, "
                             f"from {at_s:.1f} s after READY")  # fmt: skip


def read_traces(record: Path, life: Lifetime) -> None:
    from gpujitter.daemon.sinks.trace import TraceReader
    from gpujitter.errors import GpujitterError

    for path in sorted(record.glob("*.gjtrace")):
        try:
            with TraceReader(path) as reader:
                for _ in reader:
                    pass
            life.traces_read += 1
        except FileNotFoundError:
            continue  # pruned meanwhile (only while a daemon runs)
        except GpujitterError as err:
            life.trace_problems.append(str(err))
            life.problems.append(f"trace does not read back: {err}")


def account(
    life: Lifetime, tailer: LogTailer, seen_from: int, dropped_from: int, auditor: Auditor
) -> None:
    """Attributions of one ended lifetime: logged + dropped = produced (see the module)."""
    logged = tailer.attributions[seen_from:]
    life.logged = len(logged)
    life.dropped_records = tailer.dropped_records - dropped_from
    streamed = auditor.seen.get(life.pid, [])
    life.streamed = len(streamed)
    in_log = set(logged)
    # Only what came before the last status: that status counts it made and dropped.
    counted = streamed[: auditor.seen_at_status.get(life.pid, 0)]
    life.stream_missing = sum(1 for key in counted if key not in in_log)
    status = auditor.status.get(life.pid)
    if status is None:
        if life.end == "sigterm":  # a SIGKILL may come before the first status
            life.problems.append("no daemon.status reached the stream")
        return
    life.produced, life.log_dropped = status["attributions"], status["log_dropped"]
    life.trace_lost = status["trace_lost"]
    if life.end == "sigterm":
        life.unaccounted = life.produced - life.logged - life.log_dropped
        if life.unaccounted:
            life.problems.append(
                f"{life.produced} attributions made, {life.logged} logged, "
                f"{life.log_dropped} counted dropped: {life.unaccounted} unaccounted"
            )
    elif life.logged < life.produced - life.log_dropped:
        life.problems.append(
            f"killed: the last status said {life.produced} made and {life.log_dropped} "
            f"dropped, but only {life.logged} are in the log"
        )
    if life.stream_missing > life.log_dropped:
        life.problems.append(f"{life.stream_missing} streamed attributions not in the log")
    # A killed daemon's last status can be up to a status period older than its last
    # log.dropped record (the disk freed, the record written, then the SIGKILL): only a
    # stopped one's must cover every record.
    if life.end == "sigterm" and life.dropped_records > life.log_dropped:
        life.problems.append("log.dropped records count more than the daemon dropped")


def rss_growth(samples: list[tuple[float, int, int, int]], warmup_s: float) -> dict[str, Any]:
    """RSS growth after the warm-up: from the median of the window's first tenth to that of
    its last, and the least-squares slope beside it; the series (about 60 points) covers the
    warm-up too, to show what it excluded. The growth decides, not the slope: a bounded
    step (a drained backlog that Python keeps, Plan.warmup_s) counts once whenever it
    comes, where a fitted slope makes up to 1.5 times its height of one in mid-window; a
    leak grows the same either way."""
    if not samples:
        return {"samples": 0}
    t0 = samples[0][0]
    every = [(t - t0, rss) for t, rss, _, _ in samples]
    pts = [(t, rss) for t, rss in every if t >= warmup_s]
    if len(pts) < 10:
        return {"samples": len(pts)}
    n = len(pts)
    mt = sum(t for t, _ in pts) / n
    mr = sum(r for _, r in pts) / n
    var = sum((t - mt) ** 2 for t, _ in pts)
    slope = sum((t - mt) * (r - mr) for t, r in pts) / var if var else 0.0
    tenth = n // 10
    growth = statistics.median(r for _, r in pts[-tenth:]) - statistics.median(
        r for _, r in pts[:tenth]
    )
    step = max(1, len(every) // 60)  # about 60 points, to see where it grew
    return {
        "series_s_mib": [[round(t), round(r / 2**20, 1)] for t, r in every[::step]],
        "warmup_s": warmup_s,
        "samples": n,
        "window_s": round(pts[-1][0] - pts[0][0], 1),
        "growth_bytes": round(growth),
        "slope_bytes_per_hour": round(slope * 3600),
        "min_bytes": min(r for _, r in pts),
        "max_bytes": max(r for _, r in pts),
    }


def tracebacks(path: Path) -> list[str]:
    text = path.read_text(errors="replace")
    marks = ("Traceback (most recent call last)", "Fatal Python error", "Exception in thread")
    return [line for line in text.splitlines() if any(m in line for m in marks)]


# -- the run ----------------------------------------------------------------------------


def schedule(plan: Plan, rng: random.Random) -> list[tuple[float, str]]:
    """When to kill or stop the daemon: none in the first half (one long lifetime for the
    memory growth), then the kills and SIGTERMs in random order at random moments, about
    evenly spread over the second half."""
    # Every other SIGTERM lands while the daemon is still compiling its probes.
    early = plan.terms // 2
    kinds = ["kill"] * plan.kills + ["term"] * (plan.terms - early) + ["term-early"] * early
    rng.shuffle(kinds)
    half = plan.seconds / 2
    step = (plan.seconds - half) / (len(kinds) + 1)
    return [(half + step * (k + rng.uniform(0.5, 1.0)), kind) for k, kind in enumerate(kinds)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Soak:
    def __init__(self, plan: Plan, work: Path, say: Callable[[str], None]) -> None:
        self.plan, self.work, self.say = plan, work, say
        self.rng = random.Random(plan.seed)
        self.stop = threading.Event()
        self.lives: list[Lifetime] = []
        self.fill_cycles = 0
        self.fill_bytes = 0
        self.floods: list[dict[str, Any]] = []
        self.hups = 0

    def run(self) -> dict[str, Any]:
        plan = self.plan
        with small_disk(self.work / "disk", DISK_BYTES) as disk:
            notify = NotifyListener(self.work / "notify")
            notify.start()
            port = free_port()
            daemon = Daemon(self.work, disk, port, notify)
            feed = FeedLoop(plan, self.stop)
            tailer = LogTailer(daemon.log)
            auditor = Auditor(daemon.socket, self.stop)
            kinds = [CLIENT_KINDS[k % len(CLIENT_KINDS)] for k in range(plan.clients)]
            clients = [
                StreamClient(daemon.socket, kind, self.stop, random.Random(plan.seed * 1000 + k))
                for k, kind in enumerate(kinds)
            ]
            scraper = Scraper(port, self.stop, lambda: daemon.ready)
            try:
                feed.start()
                for t in (auditor, *clients, scraper):
                    t.start()
                self._drive(plan, daemon, notify, tailer, auditor, port)
            finally:
                self.stop.set()
                feed.close()
                daemon.close()
                tailer.close()
                notify.sock.close()
            result = self._result(daemon, feed, scraper, clients, auditor, tailer)
        return result

    def _drive(
        self,
        plan: Plan,
        daemon: Daemon,
        notify: NotifyListener,
        tailer: LogTailer,
        auditor: Auditor,
        port: int,
    ) -> None:
        start = now()
        events = schedule(plan, self.rng)
        next_hup = start + plan.hup_every_s
        next_flood = start + plan.flood_every_s / 2
        next_fill = start + plan.fill_every_s / 3
        filled_at: float | None = None
        filler = daemon.disk / "filler"
        life, seen_from, dropped_from = self._start(daemon, tailer)
        flood_thread: threading.Thread | None = None
        while True:
            t = now()
            daemon.sample(life)
            tailer.poll()
            for ino in list(tailer.done_files):  # renamed logs, read to the end: free them
                for old in daemon.disk.glob("attributions.jsonl.hup-*"):
                    with contextlib.suppress(FileNotFoundError):
                        if old.stat().st_ino == ino:
                            old.unlink()
                tailer.done_files.remove(ino)
            if filled_at is None and t >= next_fill:
                self.fill_bytes = max(self.fill_bytes, fill(filler))
                self.fill_cycles += 1
                filled_at = t
            elif filled_at is not None and t - filled_at >= plan.fill_every_s / 2:
                filler.unlink()
                filled_at = None
                next_fill = t + plan.fill_every_s / 2
            if t >= next_hup and daemon.ready:
                # The log is absent while the daemon has not reopened it since the last
                # rename (nothing to write yet, or the disk full): the SIGHUP still goes.
                with contextlib.suppress(FileNotFoundError):
                    daemon.log.rename(daemon.log.with_name(f"attributions.jsonl.hup-{self.hups}"))
                os.kill(life.pid, signal.SIGHUP)
                self.hups += 1
                next_hup = t + plan.hup_every_s
            next_stop = events[0][0] if events else plan.seconds
            settled = daemon.ready and next_stop - (t - start) > 10
            quiet = flood_thread is None or not flood_thread.is_alive()
            if t >= next_flood and settled and quiet:
                flood_thread = threading.Thread(
                    target=lambda: self.floods.append(flood(port, daemon.socket, self.stop)),
                    daemon=True,
                )
                flood_thread.start()
                next_flood = t + plan.flood_every_s
            final = t - start >= plan.seconds
            if final or (events and t - start >= events[0][0]):
                kind = "term" if final else events.pop(0)[1]
                sig = signal.SIGKILL if kind == "kill" else signal.SIGTERM
                daemon.stop(life, sig)
                self._end(life, daemon, notify, tailer, seen_from, dropped_from, auditor)
                if kind == "term-early":
                    seen_from, dropped_from = len(tailer.attributions), tailer.dropped_records
                    life = daemon.spawn()
                    self.lives.append(life)
                    time.sleep(self.rng.uniform(0.5, 3.0))
                    daemon.stop(life, signal.SIGTERM)
                    self._end(life, daemon, notify, tailer, seen_from, dropped_from, auditor)
                if final:
                    if flood_thread is not None:
                        flood_thread.join()
                    with contextlib.suppress(FileNotFoundError):
                        filler.unlink()
                    return
                life, seen_from, dropped_from = self._start(daemon, tailer)
            elif daemon.proc is not None and daemon.proc.poll() is not None:
                life.end, life.status = "died", daemon.proc.returncode
                life.problems.append(f"died on its own (status {life.status})")
                self._end(life, daemon, notify, tailer, seen_from, dropped_from, auditor)
                life, seen_from, dropped_from = self._start(daemon, tailer)
            time.sleep(max(0.0, 1.0 - (now() - t)))

    def _start(self, daemon: Daemon, tailer: LogTailer) -> tuple[Lifetime, int, int]:
        tailer.poll()
        life = daemon.spawn()
        self.lives.append(life)
        # Half the SIGTERMs land before READY: the daemon is compiling its probes then.
        daemon.wait_ready(life)
        self.say(
            f"daemon {life.pid} ready in {life.ready_s or -1:.1f} s (lifetime {len(self.lives)})"
        )
        return life, len(tailer.attributions), tailer.dropped_records

    def _end(
        self,
        life: Lifetime,
        daemon: Daemon,
        notify: NotifyListener,
        tailer: LogTailer,
        seen_from: int,
        dropped_from: int,
        auditor: Auditor,
    ) -> None:
        deadline = now() + 5.0  # the auditor reads what the daemon sent before closing
        while life.pid not in auditor.closed and now() < deadline:
            time.sleep(0.05)
        tailer.poll()
        check_watchdog(life, notify)
        account(life, tailer, seen_from, dropped_from, auditor)
        read_traces(daemon.record, life)
        self.say(
            f"daemon {life.pid} {life.end}"
            + (f" exit {life.exit_s:.2f} s" if life.exit_s is not None else "")
            + f": made {life.produced}, logged {life.logged}, dropped {life.log_dropped}"
            + (f"; PROBLEMS: {life.problems}" if life.problems else "")
        )

    def _result(
        self,
        daemon: Daemon,
        feed: FeedLoop,
        scraper: Scraper,
        clients: list[StreamClient],
        auditor: Auditor,
        tailer: LogTailer,
    ) -> dict[str, Any]:
        lives = self.lives
        first = lives[0]
        rss = rss_growth(first.samples, self.plan.warmup_s)
        # Events the daemon's queue refused in that lifetime: a backlog reached its bound.
        rss["engine_dropped"] = auditor.status.get(first.pid, {}).get("engine_dropped")
        baseline = first.samples[0] if first.samples else (0, 0, 0, 0)
        max_threads = max((s[2] for life in lives for s in life.samples), default=0)
        max_fds = max((s[3] for life in lives for s in life.samples), default=0)
        traces = tracebacks(self.work / "daemon.stderr")
        exits = [life.exit_s for life in lives if life.exit_s is not None]
        terms = [life for life in lives if life.end == "sigterm"]
        failures = [f"daemon {life.pid}: {p}" for life in lives for p in life.problems]
        failures += [f"log line: {b}" for b in tailer.bad]
        failures += [f"feeding loop: {e}" for e in feed.errors]
        if "growth_bytes" not in rss:
            failures.append("too few memory samples after the warm-up")
        elif rss["growth_bytes"] > RSS_GROWTH_LIMIT_BYTES:
            failures.append(f"RSS grew {rss['growth_bytes'] >> 20} MiB")
        # Threads: main, console, stream, metrics, probes' and the GPU side's few; fds: the
        # probes' at start plus every client the caps allow.
        thread_limit = baseline[2] + 4
        fd_limit = baseline[3] + 64 + 16 + 16
        if max_threads > thread_limit:
            failures.append(f"{max_threads} threads (limit {thread_limit})")
        if max_fds > fd_limit:
            failures.append(f"{max_fds} open files (limit {fd_limit})")
        limit = self.plan.exit_limit_s
        slow = [e for e in exits if e > limit]
        if slow:
            failures.append(f"{len(slow)} exits after SIGTERM took over {limit} s")
        if traces:
            failures.append(f"{len(traces)} tracebacks in the daemon's stderr: {traces[:3]}")
        if scraper.failed:
            failures.append(f"{len(scraper.failed)} scrapes failed: {scraper.failed[:3]}")
        produced = sum(life.produced or 0 for life in terms)
        if produced == 0:
            failures.append("no attribution was made: the run exercised nothing")
        if self.fill_cycles == 0 or not any(life.log_dropped for life in lives):
            failures.append("the disk never refused a log write: full disk not exercised")
        return {
            "plan": asdict(self.plan),
            "passed": not failures,
            "failures": failures,
            "lifetimes": len(lives),
            "sigkills": sum(life.end == "sigkill" for life in lives),
            "sigterms": len(terms),
            "sigterms_before_ready": sum(life.end == "sigterm-early" for life in lives),
            "attributions": {
                "produced_sigterm_lifetimes": produced,
                "logged_all": sum(life.logged for life in lives),
                "log_dropped_sigterm_lifetimes": sum(life.log_dropped or 0 for life in terms),
                "unaccounted_sigterm_lifetimes": sum(life.unaccounted or 0 for life in terms),
                "streamed_all": sum(life.streamed for life in lives),
                "stream_missing_from_log": sum(life.stream_missing for life in lives),
                "log_lines_bad": len(tailer.bad),
            },
            "trace_lost": sum(life.trace_lost or 0 for life in lives),
            "traces_read": sum(life.traces_read for life in lives),
            "rss_first_lifetime": rss,
            "threads": {"at_start": baseline[2], "max": max_threads},
            "fds": {"at_start": baseline[3], "max": max_fds},
            "watchdog": {
                "pings": sum(life.watchdog_pings for life in lives),
                "max_gap_s": round(max((life.max_ping_gap_s for life in lives), default=0), 3),
            },
            "exit_after_sigterm_s": {
                "count": len(exits),
                "max": round(max(exits, default=0), 3),
                "all": [round(e, 3) for e in exits],
            },
            "ready_s": {"max": round(max(life.ready_s or 0 for life in lives), 1)},
            "sighups": self.hups,
            "reloads_seen": sum(life.reloads for life in lives),
            "disk": {
                "bytes": DISK_BYTES,
                "fill_cycles": self.fill_cycles,
                "filler_bytes": self.fill_bytes,
            },
            "floods": len(self.floods),
            "scrapes": {
                "ok": scraper.ok,
                "failed": len(scraper.failed),
                "slowest_s": round(scraper.slowest_s, 3),
            },
            "stream_clients": {
                kind: {
                    "connections": sum(c.connections for c in clients if c.kind == kind),
                    "bytes": sum(c.bytes for c in clients if c.kind == kind),
                }
                for kind in CLIENT_KINDS
            },
            "auditor_refused": auditor.refused,
            "feeding_loop": {"segments": feed.segments, "stalls": feed.stalls},
            "tracebacks": traces,
            "lives": [{k: v for k, v in asdict(life).items() if k != "samples"} for life in lives],
        }


def summary(result: dict[str, Any]) -> str:
    a, r = result["attributions"], result["rss_first_lifetime"]
    lines = [
        f"soak {'PASSED' if result['passed'] else 'FAILED'}: {result['plan']['seconds']:.0f} s, "
        f"{result['lifetimes']} daemon lifetimes ({result['sigkills']} SIGKILL, "
        f"{result['sigterms']} SIGTERM), {result['sighups']} SIGHUP, "
        f"{result['disk']['fill_cycles']} disk fills, {result['floods']} floods",
        f"attributions (SIGTERM lifetimes): {a['produced_sigterm_lifetimes']} made = "
        f"logged + {a['log_dropped_sigterm_lifetimes']} dropped; "
        f"{a['unaccounted_sigterm_lifetimes']} unaccounted; bad log lines {a['log_lines_bad']}",
        f"RSS after warm-up: {r.get('growth_bytes', 0) / 2**20:+.1f} MiB over "
        f"{r.get('window_s', 0):.0f} s (fitted slope "
        f"{r.get('slope_bytes_per_hour', 0) / 2**20:+.1f} MiB/h)",
        f"threads max {result['threads']['max']} (start {result['threads']['at_start']}), "
        f"fds max {result['fds']['max']} (start {result['fds']['at_start']})",
        f"watchdog: {result['watchdog']['pings']} pings, longest gap "
        f"{result['watchdog']['max_gap_s']} s; exit after SIGTERM max "
        f"{result['exit_after_sigterm_s']['max']} s over {result['exit_after_sigterm_s']['count']}",
        f"scrapes ok {result['scrapes']['ok']}, failed {result['scrapes']['failed']}; "
        f"tracebacks {len(result['tracebacks'])}; trace events lost {result['trace_lost']}",
    ]
    lines += [f"FAIL: {f}" for f in result["failures"]]
    return "\n".join(lines)


def soak(
    plan: Plan, say: Callable[[str], None] = print, keep: Path | None = None
) -> dict[str, Any]:
    """Run `plan`; `keep`: a folder to leave the daemon's stderr and the notify socket in."""
    if os.geteuid() != 0:
        raise SystemExit("the soak needs root: probes, a tmpfs mount")
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        return Soak(plan, Path(tempfile.mkdtemp(prefix="soak-", dir=keep)), say).run()
    with tempfile.TemporaryDirectory(prefix="gpujitter-soak-") as work:
        return Soak(plan, Path(work), say).run()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["feed"]:
        feed_main(argv[1])
        return 0
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument(
        "--short", action="store_true", help="the test suite's version: a few kills, faster cycles"
    )
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--kills", type=int)
    p.add_argument("--terms", type=int)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument("--keep", type=Path, help="keep the daemon's stderr in a folder under this")
    args = p.parse_args(argv)
    seconds = args.minutes * 60
    plan = Plan.short(seconds) if args.short else Plan(seconds=seconds)
    overrides = {
        "clients": args.clients,
        "seed": args.seed,
        "kills": args.kills,
        "terms": args.terms,
    }
    plan = Plan(**{**asdict(plan), **{k: v for k, v in overrides.items() if v is not None}})
    result = soak(
        plan, lambda line: print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True), args.keep
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(summary(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
