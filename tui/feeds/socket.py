"""The daemon's stream socket as a feed: connect, read NDJSON, hand records on; when the
daemon goes away (restart, upgrade) wait and connect again, backing off from `retry_s` to
`retry_max_s`. Runs in the app's worker thread; every blocking call has a short timeout so
that quitting is never held up.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from gpujitter.tui.feeds import Feed, Receiver

POLL_S = 0.2  # the longest a read or a back-off sleep goes without checking stopped()


def daemon_listening(path: Path) -> bool:
    """A daemon accepts connections at `path` (the embedded mode's test)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(1.0)
    try:
        sock.connect(str(path))
    except OSError:
        return False
    finally:
        sock.close()
    return True


class SocketFeed(Feed):
    def __init__(self, path: Path, *, retry_s: float = 0.25, retry_max_s: float = 5.0) -> None:
        self.path = Path(path)
        self.label = f"daemon {self.path}"
        self.retry_s = retry_s
        self.retry_max_s = retry_max_s
        self.connections = 0  # successful connects, reconnects included
        self.bad_lines = 0

    def run(self, sink: Receiver, stopped: Callable[[], bool]) -> None:
        delay = self.retry_s
        while not stopped():
            sock = self._connect(sink)
            if sock is None:
                self._sleep(delay, stopped)
                delay = min(delay * 2, self.retry_max_s)
                continue
            self.connections += 1
            try:
                got_data = self._read(sock, sink, stopped)
            finally:
                sock.close()
            if got_data:
                delay = self.retry_s
            if not stopped():
                sink.connection("waiting", "the daemon closed the connection; reconnecting")
        sink.connection("stopped")

    def _connect(self, sink: Receiver) -> socket.socket | None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(POLL_S)
        try:
            sock.connect(str(self.path))
        except OSError as err:
            sock.close()
            sink.connection("waiting", f"no daemon at {self.path} ({err.strerror}); retrying")
            return None
        sink.connection("connected", str(self.path))
        return sock

    def _read(self, sock: socket.socket, sink: Receiver, stopped: Callable[[], bool]) -> bool:
        """Read until the daemon hangs up or stopped(); True when any record arrived."""
        buf = b""
        got = False
        while not stopped():
            try:
                chunk = sock.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                return got
            if not chunk:
                return got
            buf += chunk
            if b"\n" not in chunk:
                continue
            *lines, buf = buf.split(b"\n")
            records = []
            for line in lines:
                if not line.strip():
                    continue
                try:
                    rec = orjson.loads(line)
                except orjson.JSONDecodeError:
                    self.bad_lines += 1
                    continue
                if isinstance(rec, dict):
                    records.append(rec)
            if records:
                got = True
                sink.records(records)
        return got

    @staticmethod
    def _sleep(seconds: float, stopped: Callable[[], bool]) -> None:
        deadline = time.monotonic() + seconds
        while not stopped() and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
