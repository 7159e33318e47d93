"""The daemon's stream socket as a feed: connect, read NDJSON, hand records on; when the
daemon goes away (restart, upgrade) wait and connect again. A try that ends without a whole
session (no hello and snapshot, or an error line: the daemon refusing this client) backs off
from `retry_s` to `retry_max_s`, so that a daemon that accepts and hangs up is not asked a
thousand times a second; the status line says why it ended. A line longer than LINE_BYTES
is skipped to its newline and counted with the lines that are no JSON object
(`bad_lines`). Runs in the app's worker thread; every blocking call has a short timeout so
that quitting is never held up.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from gpujitter.daemon.sinks.stream import QUEUE_BYTES, connect
from gpujitter.errors import GpujitterError
from gpujitter.tui.feeds import Feed, Receiver

POLL_S = 0.2  # the longest a read or a back-off sleep goes without checking stopped()
HELLO_S = 5.0  # a daemon's hello comes at once; past this without one the status line says so
# Past any line a daemon sends: records fit its per-client queue (QUEUE_BYTES), and the hello
# and snapshot, queued past that bound, run to a few MiB on a node of thousands of threads.
LINE_BYTES = 16 * QUEUE_BYTES


def refusal(path: Path, err: OSError) -> str | None:
    """What to say when connecting to `path` failed because this user may not (None for
    other failures): the socket is there, its mode shuts this user out."""
    if err.errno not in (errno.EACCES, errno.EPERM):
        return None
    return (
        f"daemon at {path} refuses this user ({err.strerror}): ask for the socket's group "
        "(socket.group) or run as root"
    )


def daemon_listening(path: Path) -> bool:
    """A daemon accepts connections at `path` (the embedded mode's test). A daemon whose
    socket refuses this user is no reason to run the probes here instead: GpujitterError."""
    try:
        connect(path, 1.0).close()
    except BlockingIOError:
        return True  # there, its backlog full (clients arriving faster than it takes them)
    except OSError as err:
        if (why := refusal(path, err)) is not None:
            raise GpujitterError(why) from None
        return False
    return True


@dataclass(slots=True)
class Lines:
    """Splits received bytes into lines of at most `limit` bytes without copying what is
    held at each chunk (a list of pieces, joined once a line ends); a longer line is
    dropped, counted in `overlong`, and skipped up to its newline."""

    limit: int
    pieces: list[bytes] = field(default_factory=list)
    size: int = 0
    skipping: bool = False
    overlong: int = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        out = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if self.skipping:
                self.skipping = False  # the over-long line ends here
            elif self.size + end - start > self.limit:
                self.overlong += 1
            else:
                out.append(b"".join([*self.pieces, chunk[start:end]]))
            self.pieces.clear()
            self.size = 0
            start = end + 1
        rest = chunk[start:]
        if self.skipping or not rest:
            return out
        if self.size + len(rest) > self.limit:
            self.overlong += 1
            self.skipping = True
            self.pieces.clear()
            self.size = 0
        else:
            self.pieces.append(rest)
            self.size += len(rest)
        return out


@dataclass(slots=True)
class Session:
    """What one connection brought: a whole session has the hello and the snapshot and no
    error line."""

    hello: bool = False
    snapshot: bool = False
    error: str = ""

    @property
    def whole(self) -> bool:
        return self.hello and self.snapshot and not self.error

    def ended(self) -> str:
        if self.error:
            return f"daemon refused: {self.error}"
        if not self.whole:
            return "daemon closed before its snapshot"
        return "daemon closed the connection"


class SocketFeed(Feed):
    def __init__(
        self,
        path: Path,
        *,
        retry_s: float = 0.25,
        retry_max_s: float = 5.0,
        line_bytes: int = LINE_BYTES,
    ) -> None:
        self.path = Path(path)
        self.label = f"daemon {self.path}"
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.line_bytes = line_bytes
        self.connections = 0  # successful connects, reconnects included
        self.bad_lines = 0

    def run(self, sink: Receiver, stopped: Callable[[], bool]) -> None:
        delay = self.retry_s
        while not stopped():
            sock = self._connect(sink)
            if sock is not None:
                self.connections += 1
                try:
                    session = self._read(sock, sink, stopped)
                finally:
                    sock.close()
                if stopped():
                    break
                if session.whole:  # the daemon went away (restart): back soon
                    delay = self.retry_s
                sink.connection("waiting", f"{session.ended()}, retrying")
            self._sleep(delay, stopped)
            delay = min(delay * 2, self.retry_max_s)
        sink.connection("stopped")

    def _connect(self, sink: Receiver) -> socket.socket | None:
        """A connection, or None (the status line says why). It is announced as connected
        once the daemon's hello arrives: a refusal comes as an error line instead."""
        try:
            return connect(self.path, POLL_S)
        except BlockingIOError:
            why = "the daemon's backlog is full (clients come faster than it takes them), retrying"
        except OSError as err:
            why = refusal(self.path, err) or f"no daemon, retrying ({err.strerror or err})"
        sink.connection("waiting", why)
        return None

    def _read(self, sock: socket.socket, sink: Receiver, stopped: Callable[[], bool]) -> Session:
        """Read until the daemon hangs up or stopped()."""
        session = Session()
        lines = Lines(self.line_bytes)
        mute_after = time.monotonic() + HELLO_S
        while not stopped():
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                # A daemon that takes the connection and says nothing (wedged, or its
                # stream thread stopped) would leave the status line at "starting".
                if not session.hello and time.monotonic() > mute_after:
                    mute_after = float("inf")
                    sink.connection(
                        "waiting",
                        f"the daemon took the connection and sent no hello in {HELLO_S:g} s",
                    )
                continue
            except OSError:
                break
            if not chunk:
                break
            records = []
            for line in lines.feed(chunk):
                if not line.strip():
                    continue
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    rec = None
                if not isinstance(rec, dict):  # JSON that is no object is no record either
                    self.bad_lines += 1
                    continue
                records.append(rec)
                self._note(rec, session, sink)
            self.bad_lines += lines.overlong
            lines.overlong = 0
            if records:
                sink.records(records)
        return session

    def _note(self, rec: dict[str, object], session: Session, sink: Receiver) -> None:
        """What the session has brought so far; the hello announces the connection."""
        kind = rec.get("type")
        if kind == "hello" and not session.hello:
            session.hello = True
            sink.connection("connected", str(self.path))
        elif kind == "snapshot":
            session.snapshot = True
        elif kind == "error":
            session.error = str(rec.get("message", ""))

    @staticmethod
    def _sleep(seconds: float, stopped: Callable[[], bool]) -> None:
        deadline = time.monotonic() + seconds
        while not stopped() and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
