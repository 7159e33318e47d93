"""The daemon's unix-socket stream: NDJSON to any number of clients (the TUI, scripts).

On connect a client gets a hello (schema version, host, daemon pid, what it may see), then a
snapshot of current state, then live records as the daemon publishes them. Each client has
a queue bounded in records and in bytes: a client that reads too slowly loses records
(counted, and told so in a "dropped" message once it catches up) and never slows the daemon
or grows its memory. Clients may send one JSON request per line ({"cmd": "snapshot"} or
{"cmd": "ping"}), read at REQUESTS_PER_S after a burst (past that its socket is not read);
a bad request gets an error line, and the BAD_REQUESTS-th closes the connection; a snapshot
asked for while the last one is still unsent is not built again, one is built for a client
once a second at most and for all of them SNAPSHOT_BUILDS_PER_S times. A client that closes its
sending side still gets what it is owed (within LEAVE_S), then the connection closes. A
connection past the caps (MAX_PER_UID for a user other than root, MAX_CLIENTS - ROOT_ROOM for
such users together, MAX_CLIENTS in all) gets one error line and is closed, as is one that
comes while the daemon is out of file descriptors. New connections are taken in rounds at
most ADMIT_EVERY_S apart, all that wait at once. A user's new clients share one opening (the
hello and a snapshot, encoded once, then the records published since) for OPENING_S: a client
that connects and disconnects in a loop costs the daemon a snapshot a second, not one per
connection or per round, and the bytes of each are shared, never copied per connection.
Trouble with one client drops that client (said on stderr, at most once per kind per 10
minutes); the server thread goes on.

Threads: `publish` is called by the daemon's main thread and never blocks it for longer than
a queue append (the wake-up socket is non-blocking); the server thread accepts, reads and
writes. The snapshot callback runs on the server thread, so what it reads must be safe to
read there (NodeState copies under its lock).

Peer credentials (SO_PEERCRED) decide visibility: root sees everything; another user sees
node-wide records (CPUs, probes) and only records about processes that user owns, down to
the entries of lists inside a record (a status record's threads, a watch change's pids).
Who owns a process is read from /proc once per OWNER_CACHE_S, outside the server's lock.
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

from gpujitter.daemon.sinks.listening import FD_ERRORS, FD_PAUSE_S, ListenerPause, Notes
from gpujitter.errors import GpujitterError
from gpujitter.text import dumps, inert_json

STREAM_SCHEMA = "gpujitter.stream/1"
_READ_LIMIT = 64 * 1024  # a request line longer than this is refused
CLOSE_SEND_S = 0.5  # at close, how long all clients together may take to accept the rest
CLOSE_IDLE_S = 0.1  # at close, a client that takes nothing for this long is given up
SNAPSHOT_EVERY_S = 1.0  # per client: snapshots asked for faster are built once a second
# All clients together: snapshots asked for are built this often at most (a build is a copy
# of the state and its encoding, ~10 ms once the state has grown: 56 clients asking once a
# second each held 59 % of a CPU). One build serves every client of its user whose request
# is due; the one that waited longest goes first.
SNAPSHOT_BUILDS_PER_S = 2
QUEUE_BYTES = 4 << 20  # per client: what may wait unsent, a snapshot or two and live records
MAX_CLIENTS = 64  # past this a connection is refused (the unit caps the daemon's fds)
# New connections wait in the listen backlog (LISTEN_BACKLOG; past it a client's connect()
# waits, see `connect`) between rounds of admission this far apart: a new client's hello is
# that much later at most.
ADMIT_EVERY_S = 0.05
# A new client's hello and snapshot are built and encoded once and shared, with the records
# published since, by every client of the same user admitted within this long (a status tick):
# it starts where it would have started then, and what it reads after adds up to now. Built
# for each round of admission (a snapshot is a copy of the state and ~270 KB of JSON), ~870
# connections a second held the daemon at 23-29 % of a CPU and its RSS at 129 MiB, from 58.
OPENING_S = 1.0
# Sending takes the queue's lines joined up to this much; a longer line (a snapshot) is sent
# from the bytes it was queued as, shared by every client of its opening.
SEND_CHUNK_BYTES = 64 * 1024
PATH_CHECK_S = 5.0  # how often the server looks whether its path still names its socket
LISTEN_BACKLOG = 64
# Idle connections cost nothing to hold, so one user could fill MAX_CLIENTS and lock out
# everyone else: a user other than root may hold MAX_PER_UID, and such users together all but
# ROOT_ROOM, which is kept for root (`gpujitter top` as root always gets in).
MAX_PER_UID = 8
ROOT_ROOM = 8
# A client that keeps sending what is not a request (each costs a parse and a reply) is
# closed at this many, rather than served at a full CPU for as long as it likes.
BAD_REQUESTS = 16
# Each request costs a parse and an answer: valid pings sent in a loop (pipelined, never read)
# held the server thread at a full CPU. A client's requests are read at REQUESTS_PER_S after
# a burst of REQUEST_BURST; past that its socket is not read, so its own sends wait.
REQUESTS_PER_S = 10
REQUEST_BURST = 20
# A client that closed its sending side (`echo ... | socat`), or one closed for bad requests,
# gets what is queued for it (the answers to what it asked) within this long, then it goes.
LEAVE_S = 2.0
# Redacting a record for a user other than root looks up the owner of each process it names
# (a status lists thousands of threads): owners are kept this long, this many at most.
OWNER_CACHE_S = 1.0
OWNER_CACHE_SIZE = 1 << 16
# sun_path is 108 bytes with its terminating NUL: a longer path cannot be bound.
UNIX_PATH_MAX = 107
# Keys whose lists name processes: a non-root client sees only the entries it owns.
_PID_LISTS = ("tgids", "pids", "added", "removed")
BAD_REQUEST = 'bad request: want {"cmd": "snapshot"} or {"cmd": "ping"}'
# Lines queued for a client that are not records (answers to its requests, loss notices),
# by how they begin: their type is their first key.
_NOT_RECORDS = (b'{"type":"pong"', b'{"type":"error"', b'{"type":"dropped"')


@dataclass(slots=True)
class _Client:
    sock: socket.socket
    uid: int
    pid: int
    queue: deque[bytes] = field(default_factory=deque)
    queued_bytes: int = 0  # in `queue` and `pending`
    pending: bytes | memoryview = b""  # taken from `queue`, partly sent
    inbox: bytes = b""  # partly received request
    dropped: int = 0  # records lost since the last "dropped" notice
    dropped_total: int = 0
    snapshot_unsent: bool = False  # a snapshot is queued and not yet all sent
    snapshot_due: float = 0.0  # monotonic s from which it may have another one built
    snapshot_wanted: bool = False  # asked for one sooner: it is built when due
    bad_requests: int = 0
    tokens: float = REQUEST_BURST  # requests it may send now (see REQUESTS_PER_S)
    tokens_s: float = 0.0  # monotonic s when `tokens` was last topped up
    held: bool = False  # whole request lines wait in `inbox` for tokens
    told_held: bool = False
    skipping: bool = False  # the rest of a too-long request line is thrown away as it comes
    leave_by: float = 0.0  # monotonic s: it is leaving (see LEAVE_S); 0: it is not
    events: int = 0  # what the selector watches its socket for


@dataclass(slots=True)
class _Opening:
    """What a user's new clients get first, until `until_s` (OPENING_S): the hello and a
    snapshot as built once, then every record published for that user since."""

    first: bytes  # the hello and the snapshot
    until_s: float  # monotonic s
    since: list[bytes] = field(default_factory=list)  # the records' lines
    added_bytes: int = 0  # of `since`
    joined: bytes = b""  # `since` as one, for the clients admitted until the next line

    def add(self, line: bytes) -> None:
        self.since.append(line)
        self.added_bytes += len(line)
        self.joined = b""

    def queued(self) -> list[bytes]:
        """What a client admitted now is queued: two items, however many records came since
        (queued one by one, they cost a connect loop more than the rest of its admission)."""
        if self.since and not self.joined:
            self.joined = b"".join(self.since)
        return [self.first, self.joined] if self.since else [self.first]


def _chunk(queue: deque[bytes]) -> bytes | memoryview:
    """The next bytes to send of a client's queue (taken off it): its first line alone when
    that is SEND_CHUNK_BYTES or longer, as a view of the shared bytes; else the lines that
    fit in SEND_CHUNK_BYTES, joined (one send for many records)."""
    if len(queue[0]) >= SEND_CHUNK_BYTES:
        return memoryview(queue.popleft())
    lines = [queue.popleft()]
    size = len(lines[0])
    while queue and size + len(queue[0]) <= SEND_CHUNK_BYTES:
        size += len(queue[0])
        lines.append(queue.popleft())
    return b"".join(lines)


def _spare_fd() -> int | None:
    """A descriptor held only to be given up when none is left (None: none to be had now)."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def too_long_for_a_socket(path: str | Path) -> str | None:
    """Why `path` cannot be a unix socket's (None: it can): sun_path holds UNIX_PATH_MAX bytes.
    The configuration's checks ask before the socket's directory is made, the server again
    where it binds."""
    if (size := len(os.fsencode(path))) > UNIX_PATH_MAX:
        return f"too long for a unix socket ({size} bytes, at most {UNIX_PATH_MAX})"
    return None


def _line(record: dict[str, Any]) -> bytes:
    # inert_json: names in it are other processes' choice, and a reader may print the stream
    # as it comes (socat, nc) as people `tail -f` the log.
    return inert_json(dumps(record, orjson.OPT_NON_STR_KEYS)) + b"\n"


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
        credentials: Callable[[socket.socket], tuple[int, int, int]] = peer_credentials,
    ) -> None:
        self.path = Path(path)
        self.hello = hello
        self.snapshot = snapshot
        self.queue_limit = queue_limit
        self.queue_bytes = queue_bytes
        self.max_clients = max_clients
        self.owner = owner
        self.credentials = credentials
        self._clients: dict[int, _Client] = {}
        self._lock = threading.Lock()
        self._sel = selectors.DefaultSelector()
        # Non-blocking at both ends: a wake-up that finds the pipe full is not needed (the
        # server thread has wake-ups to read already), and publish must never wait on it.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.refused = 0  # connections refused: past the caps, or out of descriptors
        # Kept open to be closed when accept finds no descriptor free: the one it frees lets
        # the connection be taken, told why and closed, rather than wait unanswered.
        self._spare = _spare_fd()
        self._note = Notes("gpujitter stream")
        self._stop = threading.Event()
        self._mode, self._group = mode, group  # to bind the path again where it was removed
        self._listener = self._listen(mode, group)
        self._path_checked = time.monotonic()
        self._path_lost = False
        self._pause = ListenerPause(self._sel, self._listener, "accept")  # no spare either
        self._thread = threading.Thread(target=self._serve, name="gpujitter-stream", daemon=True)
        self.dropped_total = 0
        self._snapshot_next = 0.0  # monotonic s from which a requested snapshot may be built
        self._openings: dict[int, _Opening] = {}  # uid -> its new clients' first lines (lock)
        # Both threads read and fill it without a lock: a dict is only ever replaced whole.
        self._owners: dict[int, int | None] = {}
        self._owners_until = 0.0  # monotonic s

    def _listen(self, mode: int, group: str) -> socket.socket:
        if (why := too_long_for_a_socket(self.path)) is not None:
            raise GpujitterError(f"socket {self.path}: path {why}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        refuse_if_served(self.path)
        with contextlib.suppress(FileNotFoundError):
            if self.path.is_socket():
                self.path.unlink()  # a previous run's socket, nobody listening on it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(str(self.path))
        except OSError as err:
            sock.close()
            raise GpujitterError(f"socket {self.path}: {err.strerror or err}") from None
        st = os.lstat(self.path)
        self._inode = (st.st_dev, st.st_ino)  # what close() may remove: its own socket only
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
        sock.listen(LISTEN_BACKLOG)
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
        """Whether any client is connected now, or may still be given an opening (within
        OPENING_S of its snapshot, which the records since must follow). Without either a
        record goes nowhere: callers skip building it, and publish neither serialises it nor
        wakes the server thread (a wake-up per streamed record, ~100/s on the H200, cost the
        daemon CPU for nothing). A client that connects later starts from a new snapshot."""
        return bool(self._clients or self._openings)  # reads of dicts' sizes: no lock needed

    def publish(self, record: dict[str, Any], tgids: Iterable[int] | None = None) -> None:
        """Queue `record` for every client allowed to see it. `tgids`: the processes it
        concerns; None for node-wide records every client may see."""
        if not self.listened():
            return
        with self._lock:
            uids = {c.uid for c in self._clients.values()} | self._openings.keys()
        # What each user may see, worked out before the lock is taken again: the server
        # thread needs it for every client's reads and writes meanwhile.
        seen: dict[int, bytes | None] = {0: _line(record)}  # uid -> its line, if any
        others = uids - {0}
        owners = None if tgids is None or not others else {self._owner_of(t) for t in tgids}
        for uid in others:
            mine = None if owners is not None and uid not in owners else self._redact(uid, record)
            seen[uid] = None if mine is None else _line(mine)
        with self._lock:
            for client in self._clients.values():
                # A user's first client may have come meanwhile: it started from a snapshot.
                if not client.leave_by and (line := seen.get(client.uid)) is not None:
                    self._enqueue(client, line)
            self._follow_openings(seen)
        self._wake()

    def _follow_openings(self, seen: dict[int, bytes | None]) -> None:
        """A published record's line for each user (None: not theirs) added to that user's
        opening; openings past OPENING_S, or grown past a client's queue_bytes, go (the next
        new client gets a fresh one). Call with the lock held."""
        now = time.monotonic()
        for uid, opening in list(self._openings.items()):
            if now >= opening.until_s or opening.added_bytes > self.queue_bytes:
                del self._openings[uid]
            elif (line := seen.get(uid)) is not None:
                opening.add(line)

    def _owner_of(self, tgid: int) -> int | None:
        """`owner(tgid)`, asked once per OWNER_CACHE_S at most."""
        now = time.monotonic()
        if now >= self._owners_until or len(self._owners) >= OWNER_CACHE_SIZE:
            self._owners, self._owners_until = {}, now + OWNER_CACHE_S
        owners = self._owners
        if tgid not in owners:
            owners[tgid] = self.owner(tgid)
        return owners[tgid]

    def _enqueue(
        self, client: _Client, line: bytes, *, first: bool = False, answer: bool = False
    ) -> bool:
        """Queue `line` unless the client's queue is full (then count it); `first`: the
        client's first messages, which it always gets; `answer`: a pong or an error line
        for the client's own request, which is not a record: when it does not fit it is
        not sent and not counted as a dropped record (the client has left its earlier
        answers unread, and BAD_REQUESTS bounds how many it can ask for). Call with the
        lock held."""
        full = (
            len(client.queue) >= self.queue_limit
            or client.queued_bytes + len(line) > self.queue_bytes
        )
        if full and answer:
            return False
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
        wait_s = 1.0
        while not self._stop.is_set():
            for key, events in self._sel.select(timeout=self._pause.timeout(wait_s)):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(4096)
                else:
                    self._guarded(key.data, self._on_events, key.data, events)
            with self._lock:
                clients = list(self._clients.values())
            for client in clients:
                self._guarded(client, self._tend, client)
            self._build_snapshot(clients)
            self._check_path()
            wait_s = self._wait_s(clients)

    def _check_path(self) -> None:
        """Every PATH_CHECK_S, whether the socket's path still names this server's socket.
        Removed (by hand, a tmpfiles clean-up of /run), no new client could reach the daemon
        and nothing would tell: the socket is made there again, and said. Taken by something
        else (another daemon bound there, a file put in its place): that is not this
        daemon's to remove, and said once. The clients connected are served throughout."""
        now = time.monotonic()
        if self._path_lost or now < self._path_checked + PATH_CHECK_S:
            return
        self._path_checked = now
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            self._bind_again()
            return
        except OSError:
            return  # (a folder above made unsearchable: nothing to tell apart, no client either)
        if (st.st_dev, st.st_ino) != self._inode:
            self._path_lost = True
            self._note("path", f"socket {self.path} was replaced: new clients reach what is "
                       "there now, not this daemon, until it restarts")  # fmt: skip

    def _bind_again(self) -> None:
        """A listener at the path again. Connections already in the old one's backlog are
        admitted first; closing it would reset them."""
        try:
            listener = self._listen(self._mode, self._group)
        except GpujitterError as err:
            self._path_lost = True
            self._note("path", f"{err}: the socket was removed and cannot be made again; new "
                       "clients cannot reach this daemon until it restarts")  # fmt: skip
            return
        self._admit_waiting()
        self._pause.replace(listener)
        self._listener.close()
        self._listener = listener
        self._note("path", f"socket {self.path} was removed: listening there again")

    def _wait_s(self, clients: list[_Client]) -> float:
        """How long the server thread may wait for sockets: a second, less where a client's
        requests wait for its budget, its snapshot falls due or its time to leave runs out."""
        now = time.monotonic()
        wait_s = 1.0
        for c in clients:
            if c.held:  # until its next token
                wait_s = min(wait_s, c.tokens_s + (1 - c.tokens) / REQUESTS_PER_S - now)
            if c.snapshot_wanted and not c.snapshot_unsent:
                wait_s = min(wait_s, max(c.snapshot_due, self._snapshot_next) - now)
            if c.leave_by:
                wait_s = min(wait_s, c.leave_by - now)
        return max(wait_s, 0.0)

    def _on_events(self, client: _Client, events: int) -> None:
        if events & selectors.EVENT_READ:
            self._read(client)
        if events & selectors.EVENT_WRITE and client.sock.fileno() != -1:
            self._flush(client)

    def _tend(self, client: _Client) -> None:
        if client.sock.fileno() == -1:
            return  # dropped earlier in this round
        if client.leave_by and time.monotonic() >= client.leave_by:
            self._note("leave", f"closed a leaving client (pid {client.pid}) that did not take "
                       f"what it was owed within {LEAVE_S:g} s")  # fmt: skip
            self._drop(client)
            return
        if client.held:
            self._take_requests(client)
        self._flush(client)

    def _guarded(self, client: _Client, step: Callable[..., None], *args: Any) -> None:
        """Run one client's step; whatever goes wrong in it (a snapshot callback's bug, a
        socket error not foreseen) drops that client, not the server thread and so the
        stream for everyone."""
        try:
            step(*args)
        except Exception as err:
            self._note("client", f"dropped a client (pid {client.pid}) after an error: "
                       f"{type(err).__name__}: {err}")  # fmt: skip
            self._drop(client)

    def _accept(self) -> None:
        """A round of admission: every connection waiting, then the listener out of the
        selector until the next round (ADMIT_EVERY_S), or FD_PAUSE_S while out of
        descriptors."""
        self._pause.pause(self._admit_waiting())

    def _admit_waiting(self) -> float:
        """Every connection waiting in the listener's backlog admitted; how long the
        listener should then rest."""
        socks: list[socket.socket] = []
        pause_s = ADMIT_EVERY_S
        while len(socks) < LISTEN_BACKLOG:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                break  # none left (or taken back before we got to it)
            except OSError as err:
                if err.errno in FD_ERRORS:
                    self._note("fds", f"out of file descriptors ({err.strerror}): refusing "
                               "new clients")  # fmt: skip
                    if self._refuse_with_spare():
                        break
                else:
                    self._note("listen", f"accepting a client failed: {err.strerror or err}")
                pause_s = max(pause_s, FD_PAUSE_S)
                break
            socks.append(sock)
        if socks:
            self._admit(socks)
        return pause_s

    def _refuse_with_spare(self) -> bool:
        """Out of descriptors: give up the spare one for a moment, so that the waiting
        connection can be taken and told why it is refused. False when there is no spare
        (the whole system ran short and took it before it could be opened again)."""
        had_spare = self._spare is not None
        if self._spare is not None:
            os.close(self._spare)
            self._spare = None
            with contextlib.suppress(OSError):
                sock, _ = self._listener.accept()
                self._refuse(sock, "the daemon is out of file descriptors")
        self._spare = _spare_fd()
        return had_spare

    def _refuse(self, sock: socket.socket, why: str) -> None:
        self.refused += 1
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.send(_line({"type": "error", "message": why}))
        sock.close()

    def _over_cap(self, uid: int) -> str | None:
        """Why a new connection from `uid` is refused, or None (see MAX_PER_UID)."""
        with self._lock:
            uids = [c.uid for c in self._clients.values()]
        if len(uids) >= self.max_clients:
            return "too many clients"
        if uid == 0:
            return None
        if sum(1 for u in uids if u != 0) >= max(self.max_clients - ROOT_ROOM, 0):
            return "too many clients (the rest are kept for root)"
        if uids.count(uid) >= MAX_PER_UID:
            return f"too many clients for uid {uid} (at most {MAX_PER_UID})"
        return None

    def _admit(self, socks: list[socket.socket]) -> None:
        """The round's connections, past the caps, each with its user's opening: the live
        one, or one made from the snapshot built once for the round (encoded once per user:
        what a user may see is the same for all of that user's connections)."""
        snapshot: list[dict[str, Any]] | None = None
        for sock in socks:
            try:
                sock.setblocking(False)
                pid, uid, _ = self.credentials(sock)
                if (why := self._over_cap(uid)) is not None:
                    self._refuse(sock, why)
                    continue
                client = _Client(sock=sock, uid=uid, pid=pid)
                if not self._join(client):
                    if snapshot is None:
                        snapshot = list(self.snapshot())
                    self._join(client, self._opening(client, snapshot))
                self._watch(client)
            except Exception as err:  # the connection's own trouble must not end the thread
                self._note("accept", f"dropped a new client: {type(err).__name__}: {err}")
                with self._lock:
                    self._clients.pop(sock.fileno(), None)
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(sock)
                sock.close()

    def _opening(self, client: _Client, snapshot: list[dict[str, Any]]) -> _Opening:
        """A new opening for the client's user: the hello and what the user may see of the
        snapshot, encoded."""
        scope = "all" if client.uid == 0 else f"uid {client.uid}"
        hello = {**self.hello(), "type": "hello", "schema": STREAM_SCHEMA, "scope": scope}
        first = b"".join([_line(hello), *map(_line, self._visible(client, snapshot))])
        return _Opening(first, until_s=time.monotonic() + OPENING_S)

    def _join(self, client: _Client, made: _Opening | None = None) -> bool:
        """Queue its user's opening for a new client (`made`, its user's opening from now on;
        else the live one) and count it among the clients: from then on it gets what is
        published. False where its user has no opening live."""
        with self._lock:  # publish adds to the opening meanwhile
            opening = made or self._openings.get(client.uid)
            if opening is None or (opening is not made and time.monotonic() >= opening.until_s):
                return False
            self._openings[client.uid] = opening
            for lines in opening.queued():
                self._enqueue(client, lines, first=True)
            client.snapshot_unsent = True
            client.tokens_s = time.monotonic()
            client.snapshot_due = client.tokens_s + SNAPSHOT_EVERY_S
            self._clients[client.sock.fileno()] = client
        return True

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
                value = [v for v in value if not isinstance(v, int) or self._owner_of(v) == uid]
            elif isinstance(value, list) and key == "sm_util":  # (pid, percent) pairs
                value = [v for v in value if isinstance(v, list) and self._owner_of(v[0]) == uid]
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
            return self._owner_of(rec["tgid"]) == uid
        tgids = rec.get("tgids", rec.get("pids"))
        if not isinstance(tgids, list):
            return True
        return uid in {self._owner_of(t) for t in tgids if isinstance(t, int)}

    def _read(self, client: _Client) -> None:
        try:
            data = client.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # reset: nothing more can reach it either
            self._drop(client)
            return
        if not data:
            # It closed its sending side (`echo ... | socat`): what it asked is still answered,
            # its last line too when no newline ended it.
            if client.inbox.strip():
                client.inbox += b"\n"
            self._leave(client)
        elif client.skipping:
            end = data.find(b"\n")
            if end < 0:
                return
            client.inbox, client.skipping = data[end + 1 :], False
        else:
            client.inbox += data
        self._take_requests(client)

    def _take_requests(self, client: _Client) -> None:
        """Answer the whole request lines read, as many as the client's budget allows; the
        rest wait in its inbox, and its socket is not read until they have been answered. A
        line longer than _READ_LIMIT is one bad request, and the rest of it is thrown away."""
        now = time.monotonic()
        client.tokens = min(REQUEST_BURST, client.tokens + (now - client.tokens_s) * REQUESTS_PER_S)
        client.tokens_s = now
        while b"\n" in client.inbox and client.tokens >= 1 and client.sock.fileno() != -1:
            client.tokens -= 1
            line, client.inbox = client.inbox.split(b"\n", 1)
            if line.strip():
                self._request(client, line)
        client.held = b"\n" in client.inbox
        if client.held and not client.told_held:
            client.told_held = True
            self._note("requests", f"a client (pid {client.pid}) sends more than "
                       f"{REQUESTS_PER_S} requests a second: read at that pace")  # fmt: skip
        if not client.held and len(client.inbox) > _READ_LIMIT:
            client.inbox, client.skipping = b"", True
            self._bad_request(client, "request line too long")
        self._watch(client)

    def _request(self, client: _Client, line: bytes) -> None:
        try:
            req = orjson.loads(line)
            cmd = req["cmd"] if isinstance(req, dict) else None
        except (orjson.JSONDecodeError, KeyError):
            cmd = None
        if cmd == "ping":
            self._answer(client, {"type": "pong"})
        elif cmd == "snapshot":
            if client.snapshot_unsent:
                return  # the one still on its way is as recent as a new one would be
            client.snapshot_wanted = True  # built by _build_snapshot, when due
        else:
            self._bad_request(client, BAD_REQUEST)

    def _bad_request(self, client: _Client, message: str) -> None:
        """Say what is wrong; at the BAD_REQUESTS-th, say so as the last line the client
        reads (the records queued before it are dropped, so that it reads it soon) and close
        the connection."""
        client.bad_requests += 1
        if client.bad_requests < BAD_REQUESTS:
            self._answer(client, {"type": "error", "message": message})
            return
        message += f"; closing the connection after {BAD_REQUESTS} bad requests"
        with self._lock:
            self._drop_records(client)
            self._enqueue(client, _line({"type": "error", "message": message}), first=True)
        client.inbox, client.held, client.snapshot_wanted = b"", False, False
        self._leave(client)
        self._flush(client)

    def _drop_records(self, client: _Client) -> None:
        """Drop the records queued for the client, counted as dropped; the answers to its
        requests stay, as does the rest of a line it may have begun to take. Call with the
        lock held. (An item of the queue may hold several lines: an opening's.)"""
        pending = bytes(client.pending)
        begun = pending[: pending.find(b"\n") + 1]
        rest = b"".join([pending[len(begun) :], *client.queue]).split(b"\n")[:-1]
        answers = [line + b"\n" for line in rest if line.startswith(_NOT_RECORDS)]
        client.pending, client.queue = begun, deque(answers)
        client.queued_bytes = len(begun) + sum(map(len, answers))
        lost = len(rest) - len(answers)
        client.dropped += lost
        client.dropped_total += lost
        self.dropped_total += lost

    def _answer(self, client: _Client, rec: dict[str, Any]) -> None:
        with self._lock:
            self._enqueue(client, _line(rec), answer=True)

    def _build_snapshot(self, clients: list[_Client]) -> None:
        """A snapshot costs the daemon a copy of its state and its encoding: a client that
        asks in a loop gets one a second (the soak saw ten such clients hold 60 % of a CPU),
        and all of them together SNAPSHOT_BUILDS_PER_S; each build goes to every client of
        one user whose request is due, that of the client that waited longest first."""
        now = time.monotonic()
        if now < self._snapshot_next:
            return
        due = [c for c in clients if c.snapshot_wanted and not c.snapshot_unsent
               and c.snapshot_due <= now and c.sock.fileno() != -1]  # fmt: skip
        if not due:
            return
        first = min(due, key=lambda c: c.snapshot_due)
        self._snapshot_next = now + 1 / SNAPSHOT_BUILDS_PER_S
        self._guarded(first, self._send_snapshot, [c for c in due if c.uid == first.uid], now)

    def _send_snapshot(self, clients: list[_Client], now: float) -> None:
        lines = [_line(rec) for rec in self._visible(clients[0], self.snapshot())]
        with self._lock:
            for client in clients:
                client.snapshot_wanted = False
                client.snapshot_due = now + SNAPSHOT_EVERY_S
                client.snapshot_unsent = True
                for line in lines:
                    self._enqueue(client, line)
        for client in clients:
            self._flush(client)

    def _flush(self, client: _Client) -> None:
        with self._lock:
            if not client.pending and client.queue:
                client.pending = _chunk(client.queue)
            data = client.pending
        if data:
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
                if not (client.pending or client.queue):
                    client.snapshot_unsent = False
        if client.leave_by and not (
            client.pending or client.queue or client.held or client.snapshot_wanted
        ):
            self._drop(client)  # it has all it asked for
        else:
            self._watch(client)

    def _leave(self, client: _Client) -> None:
        """Read no more of the client's requests and queue no more records for it: it gets
        what is queued and the answers to requests already read, within LEAVE_S."""
        with self._lock:  # publish passes it over from now on
            client.leave_by = time.monotonic() + LEAVE_S

    def _watch(self, client: _Client) -> None:
        """Have the selector watch the client's socket for its requests (not while it leaves or
        has some waiting for its budget) and, while something waits to be sent, for room."""
        if client.sock.fileno() == -1:
            return
        reading = not (client.leave_by or client.held)
        writing = bool(client.pending or client.queue)
        events = selectors.EVENT_READ * reading | selectors.EVENT_WRITE * writing
        if events == client.events:
            return
        if not events:
            self._sel.unregister(client.sock)
        elif not client.events:
            self._sel.register(client.sock, events, client)
        else:
            self._sel.modify(client.sock, events, client)
        client.events = events

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
        never reads) is given up at once rather than at the deadline. A client's queue is
        joined into one buffer only once its socket takes more: joined for all at once, 40
        clients that never read took the daemon from 114 to 214 MB on its way out."""
        owner = {c.sock: c for c in clients if c.pending or c.queue}
        rest: dict[socket.socket, memoryview | None] = dict.fromkeys(owner)  # None: not joined
        start = time.monotonic()
        took = dict.fromkeys(rest, start)  # when each last took something
        by_fd = {sock.fileno(): sock for sock in rest}
        poller = select.poll()  # not select(): a node's probes take descriptors past 1024
        for fd in by_fd:
            poller.register(fd, select.POLLOUT)
        while rest and (left := start + CLOSE_SEND_S - time.monotonic()) > 0:
            ready = poller.poll(min(left, CLOSE_IDLE_S) * 1000)
            now = time.monotonic()
            for sock in (by_fd[fd] for fd, _ in ready if by_fd[fd] in rest):
                data = rest[sock]
                if data is None:
                    client = owner[sock]
                    data = memoryview(b"".join([client.pending, *client.queue]))
                    client.pending, client.queue, client.queued_bytes = b"", deque(), 0  # one copy
                    rest[sock] = data
                try:
                    rest[sock] = data[sock.send(data) :]
                    took[sock] = now
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    rest[sock] = memoryview(b"")
            for sock in list(rest):
                data = rest[sock]
                if (data is not None and not data) or now - took[sock] >= CLOSE_IDLE_S:
                    del rest[sock]  # all sent, or given up
                    poller.unregister(sock.fileno())

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
        if self._spare is not None:  # once: a second close must not close another's fd
            os.close(self._spare)
            self._spare = None
        self._wake_r.close()
        self._wake_w.close()
        # Only the socket it made: another daemon's, bound at the path since (this one's was
        # removed by hand), is that daemon's to remove.
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                self.path.unlink()


def refuse_if_served(path: Path) -> None:
    """GpujitterError when a daemon listens at `path`: a second one started with the same
    socket unlinked the first one's, served its clients, and removed the path at its exit,
    leaving the first unreachable for the rest of its life. A socket nobody listens on (a
    run that was killed) is left for the caller to replace. The kernel's table of this
    network namespace's sockets answers without a connection (each would have the daemon
    build a client's snapshot); a listener it does not show (another namespace's) is asked
    by connecting."""
    if path.is_socket() and (_listening_here(path) or _answers(path)):
        raise GpujitterError(
            f"socket {path}: a gpujitter daemon is already serving it (`systemctl status "
            "gpujitter`); stop it, or give this one another socket.path"
        )


_ACCEPTING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's Flags: a listening socket


def _listening_here(path: Path) -> bool:
    """Whether this network namespace's table lists a listener bound at `path` (False where
    it cannot be read: the connection asks then)."""
    names = {str(path), os.path.abspath(path)}
    try:
        with open("/proc/net/unix", encoding="utf-8", errors="surrogateescape") as table:
            next(table, None)  # the header
            rows = (line.rstrip("\n").split(None, 7) for line in table)
            return any(len(f) == 8 and f[7] in names and int(f[3], 16) & _ACCEPTING for f in rows)
    except (OSError, ValueError):
        return False


def _answers(path: Path) -> bool:
    """Whether something accepts connections at `path`: a full backlog (EAGAIN) and a socket
    this user may not reach count as served; refused or gone as stale; any other error
    as not served (binding there says why)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except (BlockingIOError, TimeoutError, PermissionError):
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return True


def connect(path: Path, timeout_s: float) -> socket.socket:
    """A client's connection to the daemon at `path`, with `timeout_s` as its timeout. While
    the listen backlog is full (clients come faster than the admission rounds take them: a
    burst, or one that connects and hangs up in a loop) a connect() under a timeout fails at
    once with EAGAIN, and a client reading that as "no daemon" would stay away (or `top`
    would run the probes a second time beside the daemon). A blocking connect() instead
    waits in the kernel's queue for a slot, woken as the daemon accepts, for as long as the
    socket's send timeout: so it is made that way. BlockingIOError: no slot came in time
    (a daemon is there); other OSErrors as connect() raises them."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        usec = max(int(timeout_s * 1e6), 1000)
        sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", *divmod(usec, 1_000_000))
        )
        sock.connect(str(path))
        # A signal that interrupts the wait makes Python finish connect() by polling, which
        # on a unix socket reports success although none happened: ENOTCONN here instead.
        sock.getpeername()
        sock.settimeout(timeout_s)
    except BaseException:
        sock.close()
        raise
    return sock


def first_records(path: Path, types: Iterable[str], timeout_s: float) -> dict[str, dict[str, Any]]:
    """A client for a moment: the first record of each of `types` that the daemon listening
    at `path` sends a new client (its "hello", its "snapshot"), by type; those that did not
    come within `timeout_s` are missing, however slowly the bytes trickle in. OSError when no
    daemon can be reached there (none listening, or the socket's mode shuts this user out);
    GpujitterError, with the daemon's reason, when it refused the connection."""
    wanted = set(types)
    got: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    buf = b""
    with connect(path, timeout_s) as client:
        while wanted - got.keys() and (left := deadline - time.monotonic()) > 0:
            client.settimeout(left)  # the deadline holds for each recv, not between lines
            try:
                data = client.recv(1 << 16)
            except TimeoutError:
                break
            if not data:
                break  # the daemon closed the connection (stopping)
            buf += data
            *lines, buf = buf.split(b"\n")
            if len(buf) > QUEUE_BYTES:
                buf = b""  # no line the daemon sends is this long: not one of these
            for line in lines:
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                kind = rec.get("type") if isinstance(rec, dict) else None
                if kind == "error" and not got:  # its first line: the connection refused
                    raise GpujitterError(
                        f"the daemon at {path} refused the connection: {rec.get('message')}"
                    )
                if isinstance(kind, str) and kind in wanted and kind not in got:
                    got[kind] = rec
    return got
