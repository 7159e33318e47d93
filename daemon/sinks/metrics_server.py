"""The HTTP endpoint behind `metrics.listen`: one selector thread answers GET and HEAD of
/metrics, whatever clients do. Connections are capped, taken at a bounded rate, each gets a
few seconds for its request and as many for its reply, then a moment in which what it still
sends is read and thrown away (so that the close does not reset its reply), and client
misbehaviour is counted, never written out as a traceback. The exposition is rendered once a
second at most, whatever the rate of scrapes.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gpujitter.daemon.sinks.listening import FD_ERRORS, ListenerPause, Notes

# Scrapers open one connection at a time; more than this is a flood or a leak, and the unit's
# TasksMax would not care (one thread serves them all) but file descriptors and memory would.
MAX_CONNECTIONS = 16
# For the request to arrive in full, then again for the reply to be taken: a scraper needs
# milliseconds; an idle or trickling (slowloris) connection goes when this runs out.
CONNECTION_TIMEOUT_S = 5.0
REQUEST_LIMIT_BYTES = 8192  # request line and headers; a scrape sends a few hundred
# A close with bytes of the client's unread resets the connection, and the client may lose
# its reply (an oversized request got a reset, not its 431): after the reply the server shuts
# its side and reads what the client still sends, this long and this much at most, then closes.
LINGER_S = 1.0
LINGER_BYTES = 64 * 1024
# A render reads /proc and walks every series (~1.1 ms): three clients scraping in a loop
# (~900 scrapes a second) held the daemon at 92-99 % of a CPU. It is rendered this often at
# most, and every scrape meanwhile gets the same bytes: what a scrape shows is at most this
# old (the daemon updates most series once a tick, a second, anyway).
RENDER_EVERY_S = 1.0
# Served from those bytes, a scrape still costs the server thread ~60 us (accept, request,
# reply, close), and clients in a loop then asked 12,500 a second (79 % of a CPU): connections
# are taken at ACCEPTS_PER_S after a burst of ACCEPT_BURST (a flood of idle connections as
# deep as the backlog at once); past that they wait in the listen backlog and are taken
# ACCEPT_ROUND at a time, one wake-up for several (three clients in a loop: 1.5 % of a CPU,
# 3.5 % one at a time).
ACCEPTS_PER_S = 100
ACCEPT_BURST = 128
ACCEPT_ROUND = 5
LISTEN_BACKLOG = 128

_STATUS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}


@dataclass(slots=True)
class _Connection:
    sock: socket.socket
    deadline_s: float
    inbox: bytes = b""
    outbox: bytes = b""
    replying: bool = False
    lingering: bool = False  # its reply is out: what it still sends is thrown away
    lingered_bytes: int = 0


class MetricsServer:
    """Serve `render()` as Prometheus text on (host, port). Binding happens here, so that the
    caller learns of a bad address at once (OSError); `start` runs the selector thread.
    `closed(reason)` is told of every connection closed for cause: "over_limit" (the one that
    waited longest goes when a new one would pass MAX_CONNECTIONS), "timeout",
    "bad_request"."""

    def __init__(
        self,
        host: str,
        port: int,
        render: Callable[[], bytes],
        *,
        closed: Callable[[str], None],
        timeout_s: float = CONNECTION_TIMEOUT_S,
    ) -> None:
        self.render = render
        self.closed = closed
        self.timeout_s = timeout_s
        self._note = Notes("gpujitter metrics")
        self._conns: dict[socket.socket, _Connection] = {}  # in order of arrival
        self._body = b""  # the last render, served until RENDER_EVERY_S after it
        self._rendered_s = -RENDER_EVERY_S  # monotonic s
        self._tokens = float(ACCEPT_BURST)  # connections it may take now (ACCEPTS_PER_S)
        self._tokens_s = time.monotonic()  # when `_tokens` was last topped up
        self._listener = self._listen(host, port)
        self._sel = selectors.DefaultSelector()
        self._pause = ListenerPause(self._sel, self._listener)  # while out of descriptors
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="gpujitter-metrics", daemon=True)

    @staticmethod
    def _listen(host: str, port: int) -> socket.socket:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(LISTEN_BACKLOG)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        return sock

    def start(self) -> MetricsServer:
        self._sel.register(self._listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        if self._thread.is_alive():
            self._thread.join()
        for conn in list(self._conns.values()):
            self._drop(conn)
        self._sel.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    # -- the server thread --------------------------------------------------------------

    def _serve(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            first = min((c.deadline_s for c in self._conns.values()), default=now + 1.0)
            timeout = self._pause.timeout(min(max(first - now, 0.0), 1.0))
            for key, _ in self._sel.select(timeout=timeout):
                if key.fileobj is self._listener:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(64)
                elif key.data.lingering:
                    self._linger(key.data)
                elif key.data.replying:
                    self._send(key.data)
                else:
                    self._receive(key.data)
            now = time.monotonic()
            late = f"closed a connection idle or slower than {self.timeout_s:g} s"
            for conn in [c for c in self._conns.values() if c.deadline_s <= now]:
                if conn.lingering:
                    self._drop(conn)  # its reply is out: not a connection closed for cause
                else:
                    self._give_up(conn, "timeout", late)

    def _accept(self) -> None:
        now = time.monotonic()
        self._tokens = min(ACCEPT_BURST, self._tokens + (now - self._tokens_s) * ACCEPTS_PER_S)
        self._tokens_s = now
        while self._tokens >= 1:
            try:
                sock, _ = self._listener.accept()
            except OSError as err:  # none left, the client already gone, or no descriptor
                if err.errno in FD_ERRORS:
                    self._note("fds", f"out of file descriptors ({err.strerror}): new "
                               "connections wait until some are free")  # fmt: skip
                    self._pause.pause()
                return
            self._tokens -= 1
            sock.setblocking(False)
            if len(self._conns) >= MAX_CONNECTIONS:
                # One that has had its reply goes first: it loses nothing it asked for.
                # Else the newest is likeliest a scraper about to send its request.
                lingering = [c for c in self._conns.values() if c.lingering]
                waiting = [c for c in self._conns.values() if not c.replying]
                if lingering:
                    self._drop(lingering[0])
                else:
                    self._give_up(
                        waiting[0] if waiting else _Connection(sock, 0.0),
                        "over_limit",
                        f"closed a connection over the limit of {MAX_CONNECTIONS}",
                    )
                    if not waiting:
                        continue
            conn = _Connection(sock, time.monotonic() + self.timeout_s)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            # A scraper sends its request as it connects: read it now, so that the rest of
            # a flood accepted in this batch cannot push it out unanswered (a close with its
            # request unread resets the scraper's connection) before the selector sees it.
            self._receive(conn)
        self._pause.pause((ACCEPT_ROUND - self._tokens) / ACCEPTS_PER_S)  # out of tokens

    @staticmethod
    def _recv(conn: _Connection, size: int) -> bytes | None:
        """What the client sent (b"": it closed, or the connection failed); None when
        nothing waits."""
        try:
            return conn.sock.recv(size)
        except (BlockingIOError, InterruptedError):
            return None
        except OSError:
            return b""

    def _receive(self, conn: _Connection) -> None:
        data = self._recv(conn, 4096)
        if data is None:
            return
        if not data:
            self._drop(conn)
            return
        # Empty lines before the request line are ignored (RFC 9112 2.2: a client may send
        # one after a POST's body).
        conn.inbox = (conn.inbox + data).lstrip(b"\r\n")
        # RFC 9112 lets a server take a bare LF for CRLF: some minimal health checkers send one.
        ends = [i for i in (conn.inbox.find(b"\r\n\r\n"), conn.inbox.find(b"\n\n")) if i >= 0]
        # The limit holds for a request that came whole in one read as for one trickled in.
        if min(ends, default=len(conn.inbox)) > REQUEST_LIMIT_BYTES:
            self._reply(conn, 431, bad="bad_request")
        elif ends:
            self._answer(conn, conn.inbox[: min(ends)].split(b"\n", 1)[0].rstrip(b"\r"))

    def _answer(self, conn: _Connection, request_line: bytes) -> None:
        words = request_line.split()
        if len(words) != 3 or not words[2].startswith(b"HTTP/"):
            self._reply(conn, 400, bad="bad_request")
            return
        method, target = words[0], words[1].partition(b"?")[0]
        if method not in (b"GET", b"HEAD"):
            self._reply(conn, 405)
        elif target != b"/metrics":
            self._reply(conn, 404)
        else:
            try:
                body = self._exposition()
            except Exception as err:  # a collector's failure must not end the server
                self._note("render", f"exposition failed: {type(err).__name__}: {err}")
                self._reply(conn, 500)
                return
            self._reply(conn, 200, body, head_only=method == b"HEAD")

    def _exposition(self) -> bytes:
        now = time.monotonic()
        if now - self._rendered_s >= RENDER_EVERY_S:
            self._body = self.render()
            self._rendered_s = now
        return self._body

    def _reply(
        self,
        conn: _Connection,
        status: int,
        body: bytes = b"",
        *,
        head_only: bool = False,
        bad: str = "",
    ) -> None:
        """Send the reply, then close (after lingering); `bad` counts the connection as
        closed for that reason."""
        if bad:
            self.closed(bad)
            self._note(bad, f"refused a malformed or oversized request ({status})")
        head = (
            f"HTTP/1.1 {status} {_STATUS[status]}\r\n"
            f"Content-Type: {CONTENT_TYPE_LATEST if status == 200 else 'text/plain'}\r\n"
            f"Content-Length: {len(body)}\r\n"
            + ("Allow: GET, HEAD\r\n" if status == 405 else "")
            + "Connection: close\r\n\r\n"
        )
        conn.outbox = head.encode() + (b"" if head_only else body)
        conn.replying = True
        conn.deadline_s = time.monotonic() + self.timeout_s
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._send(conn)

    def _send(self, conn: _Connection) -> None:
        try:
            sent = conn.sock.send(conn.outbox)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client left without its reply
            self._drop(conn)
            return
        conn.outbox = conn.outbox[sent:]
        if not conn.outbox:
            self._shut(conn)

    def _shut(self, conn: _Connection) -> None:
        """The reply is out: end it (the client reads its end) and linger (see LINGER_S)."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:  # the client is gone
            self._drop(conn)
            return
        conn.lingering = True
        conn.deadline_s = time.monotonic() + LINGER_S
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        self._linger(conn)

    def _linger(self, conn: _Connection) -> None:
        data = self._recv(conn, 65536)
        if data is None:
            return
        conn.lingered_bytes += len(data)
        if not data or conn.lingered_bytes > LINGER_BYTES:
            self._drop(conn)

    def _give_up(self, conn: _Connection, reason: str, text: str) -> None:
        self.closed(reason)
        self._note(reason, text)
        self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        if self._conns.pop(conn.sock, None) is not None:
            self._sel.unregister(conn.sock)
        conn.sock.close()
