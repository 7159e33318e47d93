"""The daemon's unix-socket stream: NDJSON to any number of clients (the TUI, scripts).

On connect a client gets a hello (schema version, host, daemon pid, what it may see), then a
snapshot of current state, then live records as the daemon publishes them. Each client has
a queue bounded in records and in bytes: a client that reads too slowly loses records
(counted, and told so in a "dropped" message once it catches up) and never slows the daemon
or grows its memory. Clients may send one JSON request per line ({"cmd": "snapshot"} or
{"cmd": "ping"}); a bad request gets an error line; a snapshot asked for while the last one
is still unsent is not built again. Past `max_clients` a new connection gets one error line
and is closed.

Threads: `publish` is called by the daemon's main thread and never blocks it for longer than
a queue append (the wake-up socket is non-blocking); the server thread accepts, reads and
writes. The snapshot callback runs on the server thread, so what it reads must be safe to
read there (NodeState copies under its lock).

Peer credentials (SO_PEERCRED) decide visibility: root sees everything; another user sees
node-wide records (CPUs, probes) and only records about processes that user owns, down to
the entries of lists inside a record (a status record's threads, a watch change's pids).
"""

from __future__ import annotations

import contextlib
import grp
import os
import select
import selectors
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gpujitter.errors import GpujitterError

STREAM_SCHEMA = "gpujitter.stream/1"
_READ_LIMIT = 64 * 1024  # a request line longer than this is refused
CLOSE_SEND_S = 0.5  # at close, how long all clients together may take to accept the rest
CLOSE_IDLE_S = 0.1  # at close, a client that takes nothing for this long is given up
SNAPSHOT_EVERY_S = 1.0  # per client: snapshots asked for faster are built once a second
QUEUE_BYTES = 4 << 20  # per client: what may wait unsent, a snapshot or two and live records
MAX_CLIENTS = 64  # past this a connection is refused (the unit caps the daemon's fds)
# Keys whose lists name processes: a non-root client sees only the entries it owns.
_PID_LISTS = ("tgids", "pids", "added", "removed")
BAD_REQUEST = 'bad request: want {"cmd": "snapshot"} or {"cmd": "ping"}'


@dataclass(slots=True)
class _Client:
    sock: socket.socket
    uid: int
    pid: int
    queue: deque[bytes] = field(default_factory=deque)
    queued_bytes: int = 0  # in `queue` and `pending`
    pending: bytes = b""  # partly sent line
    inbox: bytes = b""  # partly received request
    dropped: int = 0  # records lost since the last "dropped" notice
    dropped_total: int = 0
    snapshot_unsent: bool = False  # a snapshot is queued and not yet all sent
    snapshot_due: float = 0.0  # monotonic s from which it may have another one built
    snapshot_wanted: bool = False  # asked for one sooner: it is built when due


def _line(record: dict[str, Any]) -> bytes:
    return orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS) + b"\n"


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


def process_owner(tgid: int, proc: Path = Path("/proc")) -> int | None:
    try:
        return (proc / str(tgid)).stat().st_uid
    except OSError:
        return None


class StreamServer:
    """Serve the stream on `path`. `hello` and `snapshot` build the first messages for a
    client; `owner` maps a process id to its uid (injectable for tests)."""

    def __init__(
        self,
        path: Path,
        *,
        hello: Callable[[], dict[str, Any]],
        snapshot: Callable[[], Iterable[dict[str, Any]]],
        queue_limit: int = 4096,
        queue_bytes: int = QUEUE_BYTES,
        max_clients: int = MAX_CLIENTS,
        mode: int = 0o660,
        group: str = "",
        owner: Callable[[int], int | None] = process_owner,
    ) -> None:
        self.path = Path(path)
        self.hello = hello
        self.snapshot = snapshot
        self.queue_limit = queue_limit
        self.queue_bytes = queue_bytes
        self.max_clients = max_clients
        self.owner = owner
        self._clients: dict[int, _Client] = {}
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        # Non-blocking at both ends: a wake-up that finds the pipe full is not needed (the
        # server thread has wake-ups to read already), and publish must never wait on it.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.refused = 0  # connections refused past max_clients
        self._stop = threading.Event()
        self._listener = self._listen(mode, group)
        self._thread = threading.Thread(target=self._serve, name="gpujitter-stream", daemon=True)
        self.dropped_total = 0

    def _listen(self, mode: int, group: str) -> socket.socket:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if self.path.is_socket():
                self.path.unlink()  # a previous run's socket
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(str(self.path))
        except OSError as err:
            sock.close()
            raise GpujitterError(f"socket {self.path}: {err.strerror}") from None
        if group:
            try:
                os.chown(self.path, -1, grp.getgrnam(group).gr_gid)
            except KeyError:
                sock.close()
                raise GpujitterError(f"socket group {group!r} does not exist") from None
            except PermissionError:
                sock.close()
                raise GpujitterError(
                    f"socket {self.path}: cannot give it to group {group!r} (needs CAP_CHOWN)"
                ) from None
        os.chmod(self.path, mode)
        sock.listen(16)
        sock.setblocking(False)
        return sock

    def start(self) -> StreamServer:
        self._sel.register(self._listener, selectors.EVENT_READ, "accept")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread.start()
        return self

    @property
    def clients(self) -> int:
        with self._lock:
            return len(self._clients)

    @property
    def backlog_bytes(self) -> int:
        """What waits unsent for all clients together (bounded by queue_bytes each)."""
        with self._lock:
            return sum(c.queued_bytes for c in self._clients.values())

    # -- publishing (any thread) --------------------------------------------------------

    def listened(self) -> bool:
        """Whether any client is connected now. Without one a record goes nowhere: callers
        skip building it, and publish neither serialises it nor wakes the server thread (a
        wake-up per streamed record, ~100/s on the H200, cost the daemon CPU for nothing).
        A client that connects later starts from a snapshot, not from past records."""
        return bool(self._clients)  # one read of a dict's size: safe without the lock

    def publish(self, record: dict[str, Any], tgids: Iterable[int] | None = None) -> None:
        """Queue `record` for every client allowed to see it. `tgids`: the processes it
        concerns; None for node-wide records every client may see."""
        if not self._clients:
            return
        line = _line(record)
        concerned = None if tgids is None else tuple(tgids)
        owners: dict[int, int | None] = {}
        redacted: dict[int, bytes | None] = {}  # uid -> what that user may see of it
        with self._lock:
            for client in self._clients.values():
                if client.uid == 0:
                    self._enqueue(client, line)
                    continue
                if concerned is not None:
                    if not owners and concerned:
                        owners = {t: self.owner(t) for t in concerned}
                    if client.uid not in owners.values():
                        continue
                if client.uid not in redacted:
                    seen = self._redact(client.uid, record)
                    redacted[client.uid] = None if seen is None else _line(seen)
                if (mine := redacted[client.uid]) is not None:
                    self._enqueue(client, mine)
        self._wake()

    def _enqueue(self, client: _Client, line: bytes, *, first: bool = False) -> bool:
        """Queue `line` unless the client's queue is full (then count it); `first`: the
        client's first messages, which it always gets. Call with the lock held."""
        full = (
            len(client.queue) >= self.queue_limit
            or client.queued_bytes + len(line) > self.queue_bytes
        )
        if full and not first:
            client.dropped += 1
            client.dropped_total += 1
            self.dropped_total += 1
            return False
        if client.dropped:
            # Say what was lost before the first record after the loss.
            notice = {"type": "dropped", "count": client.dropped, "total": client.dropped_total}
            client.queue.append(_line(notice))
            client.queued_bytes += len(client.queue[-1])
            client.dropped = 0
        client.queue.append(line)
        client.queued_bytes += len(line)
        return True

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_w.send(b"\0")

    # -- the server thread --------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, events in self._sel.select(timeout=1.0):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(4096)
                else:
                    client = key.data
                    if events & selectors.EVENT_READ:
                        self._read(client)
                    if events & selectors.EVENT_WRITE and client.sock.fileno() != -1:
                        self._flush(client)
            with self._lock:
                clients = list(self._clients.values())
            for client in clients:
                if client.snapshot_wanted and not client.snapshot_unsent:
                    self._send_snapshot_if_due(client)
                self._flush(client)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        if self.clients >= self.max_clients:
            self.refused += 1
            with contextlib.suppress(OSError):
                sock.send(_line({"type": "error", "message": "too many clients"}))
            sock.close()
            return
        pid, uid, _ = peer_credentials(sock)
        client = _Client(sock=sock, uid=uid, pid=pid)
        first = [
            {
                **self.hello(),
                "type": "hello",
                "schema": STREAM_SCHEMA,
                "scope": "all" if uid == 0 else f"uid {uid}",
            }
        ]
        first += list(self._visible(client, self.snapshot()))
        with self._lock:
            for rec in first:
                self._enqueue(client, _line(rec), first=True)
            client.snapshot_unsent = True
            client.snapshot_due = time.monotonic() + SNAPSHOT_EVERY_S
            self._clients[sock.fileno()] = client
        self._sel.register(sock, selectors.EVENT_READ, client)

    def _visible(self, client: _Client, records: Iterable[dict[str, Any]]) -> Iterable[dict]:
        """The records (and, inside them, the listed entries) this client may see."""
        for rec in records:
            if client.uid == 0:
                yield rec
            elif (seen := self._redact(client.uid, rec)) is not None:
                yield seen

    def _redact(self, uid: int, rec: dict[str, Any]) -> dict[str, Any] | None:
        """What user `uid` may see of `rec`: None when it concerns only others' processes;
        else the record with the entries of its lists (records, threads, pids) that name
        others' processes taken out, at any depth."""
        if not self._allowed(uid, rec):
            return None
        out: dict[str, Any] = {}
        for key, value in rec.items():
            if isinstance(value, dict):
                value = self._redact(uid, value) or {}
            elif isinstance(value, list) and key in _PID_LISTS:
                value = [v for v in value if not isinstance(v, int) or self.owner(v) == uid]
            elif isinstance(value, list) and key == "sm_util":  # (pid, percent) pairs
                value = [v for v in value if isinstance(v, list) and self.owner(v[0]) == uid]
            elif isinstance(value, list):
                value = [
                    r if not isinstance(r, dict) else self._redact(uid, r)
                    for r in value
                    if not isinstance(r, dict) or self._allowed(uid, r)
                ]
            out[key] = value
        return out

    def _allowed(self, uid: int, rec: dict[str, Any]) -> bool:
        """Whether a record (or an entry of a list) that names processes names one of
        `uid`'s; one that names none is node-wide."""
        if "tgid" in rec and isinstance(rec["tgid"], int):
            return self.owner(rec["tgid"]) == uid
        tgids = rec.get("tgids", rec.get("pids"))
        if not isinstance(tgids, list):
            return True
        return uid in {self.owner(t) for t in tgids if isinstance(t, int)}

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        client.inbox += data
        if len(client.inbox) > _READ_LIMIT and b"\n" not in client.inbox:
            self._reply(client, {"type": "error", "message": "request line too long"})
            client.inbox = b""
        while b"\n" in client.inbox:
            line, client.inbox = client.inbox.split(b"\n", 1)
            if line.strip():
                self._request(client, line)

    def _request(self, client: _Client, line: bytes) -> None:
        try:
            req = orjson.loads(line)
            cmd = req["cmd"] if isinstance(req, dict) else None
        except (orjson.JSONDecodeError, KeyError):
            cmd = None
        if cmd == "ping":
            self._reply(client, {"type": "pong"})
        elif cmd == "snapshot":
            if client.snapshot_unsent:
                return  # the one still on its way is as recent as a new one would be
            client.snapshot_wanted = True
            self._send_snapshot_if_due(client)
        else:
            self._reply(client, {"type": "error", "message": BAD_REQUEST})

    def _send_snapshot_if_due(self, client: _Client) -> None:
        """A snapshot costs the daemon a copy of its state and its encoding: a client that
        asks in a loop gets one a second (the soak saw ten such clients hold 60 % of a CPU)."""
        now = time.monotonic()
        if not client.snapshot_wanted or now < client.snapshot_due:
            return
        client.snapshot_wanted = False
        client.snapshot_due = now + SNAPSHOT_EVERY_S
        for rec in self._visible(client, self.snapshot()):
            self._reply(client, rec)
        client.snapshot_unsent = True

    def _reply(self, client: _Client, rec: dict[str, Any]) -> None:
        with self._lock:
            self._enqueue(client, _line(rec))

    def _flush(self, client: _Client) -> None:
        with self._lock:
            if not client.pending and client.queue:
                client.pending = b"".join(client.queue)
                client.queue.clear()
            data = client.pending
        if not data:
            self._want_write(client, False)
            return
        try:
            sent = client.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(client)
            return
        with self._lock:
            client.pending = client.pending[sent:]
            client.queued_bytes -= sent
            more = bool(client.pending or client.queue)
            if not more:
                client.snapshot_unsent = False
        self._want_write(client, more)

    def _want_write(self, client: _Client, more: bool) -> None:
        if client.sock.fileno() == -1:
            return
        mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if more else 0)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.modify(client.sock, mask, client)

    def _drop(self, client: _Client) -> None:
        with self._lock:
            self._clients.pop(client.sock.fileno(), None)
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(client.sock)
        client.sock.close()

    def _send_rest(self, clients: list[_Client]) -> None:
        """At close: what is still queued for the clients (the attributions the daemon
        decides while stopping), within one deadline for all of them, so that stuck clients
        cannot hold up the stop; a client that takes nothing for CLOSE_IDLE_S (one that
        never reads) is given up at once rather than at the deadline."""
        rest = {c.sock: memoryview(c.pending + b"".join(c.queue)) for c in clients}
        rest = {sock: data for sock, data in rest.items() if data}
        start = time.monotonic()
        took = dict.fromkeys(rest, start)  # when each last took something
        while rest and (left := start + CLOSE_SEND_S - time.monotonic()) > 0:
            _, writable, _ = select.select([], list(rest), [], min(left, CLOSE_IDLE_S))
            now = time.monotonic()
            for sock in writable:
                try:
                    rest[sock] = rest[sock][sock.send(rest[sock]) :]
                    took[sock] = now
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    rest[sock] = memoryview(b"")
            for sock in [s for s in rest if not rest[s] or now - took[s] >= CLOSE_IDLE_S]:
                del rest[sock]

    def close(self) -> None:
        self._stop.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            clients = list(self._clients.values())
        self._send_rest(clients)
        for client in clients:
            self._drop(client)
        self._sel.close()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def first_records(path: Path, types: Iterable[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """A client for a moment: the first record of each of `types` that the daemon listening
    at `path` sends a new client (its "hello", its "snapshot"), by type; those that did not
    come within `timeout_s` are missing. OSError when no daemon can be reached there (none
    listening, or the socket's mode shuts this user out)."""
    wanted = set(types)
    got: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(timeout_s)
        client.connect(str(path))
        reader = client.makefile("rb")
        while wanted - got.keys() and time.monotonic() < deadline:
            try:
                line = reader.readline(QUEUE_BYTES)
            except TimeoutError:
                break
            if not line:
                break  # the daemon closed the connection (too many clients, stopping)
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a line cut at the limit: not one of these
            kind = rec.get("type") if isinstance(rec, dict) else None
            if isinstance(kind, str) and kind in wanted and kind not in got:
                got[kind] = rec
    return got
