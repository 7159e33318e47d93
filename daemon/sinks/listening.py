"""What the daemon's two listening servers (the stream socket, the metrics endpoint) share:
their lines to the journal about trouble, and what they do when the process is out of file
descriptors."""

from __future__ import annotations

import errno
import selectors
import socket
import sys
import time

NOTE_INTERVAL_S = 600.0  # at most one stderr line per kind of trouble this often
# accept() failing for want of a descriptor or of memory for one: the listener stays readable
FD_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
FD_PAUSE_S = 0.1


class Notes:
    """One stderr line (the journal, under systemd) per kind of trouble per interval, saying
    how many times it happened since the last line of that kind; `who` starts each line."""

    def __init__(self, who: str, interval_s: float = NOTE_INTERVAL_S) -> None:
        self.who = who
        self.interval_s = interval_s
        self._last_s: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def __call__(self, kind: str, text: str) -> None:
        now = time.monotonic()
        self._since[kind] = self._since.get(kind, 0) + 1
        last = self._last_s.get(kind)
        if last is not None and now - last < self.interval_s:
            return
        times = self._since.pop(kind)
        again = f" ({times} times in the last {now - last:.0f} s)" if last is not None else ""
        print(f"{self.who}: {text}{again}", file=sys.stderr, flush=True)
        self._last_s[kind] = now


class ListenerPause:
    """A listener taken out of its selector for a while (FD_PAUSE_S unless told). Out of file
    descriptors, accept keeps failing while the listener stays readable, and the server's loop
    would spin on it; meanwhile new connections wait in the backlog."""

    def __init__(self, sel: selectors.BaseSelector, listener: socket.socket, data: object = None):
        self._sel = sel
        self._listener = listener
        self._data = data  # what the listener is registered with
        self._until = 0.0  # monotonic s; 0: not paused

    def replace(self, listener: socket.socket) -> None:
        """Serve `listener` from now on in place of the one given (which the caller closes):
        in the selector at once, or at the pause's end while paused."""
        if not self._until:
            self._sel.unregister(self._listener)
            self._sel.register(listener, selectors.EVENT_READ, self._data)
        self._listener = listener

    def pause(self, seconds: float = FD_PAUSE_S) -> None:
        self._sel.unregister(self._listener)
        self._until = time.monotonic() + seconds

    def timeout(self, limit_s: float) -> float:
        """Before each select: the listener back in once its pause is over, and `limit_s`
        cut to the pause's end while it lasts."""
        if not self._until:
            return limit_s
        left = self._until - time.monotonic()
        if left > 0:
            return min(limit_s, left)
        self._until = 0.0
        self._sel.register(self._listener, selectors.EVENT_READ, self._data)
        return limit_s
