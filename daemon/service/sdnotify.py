"""systemd's notify protocol (sd_notify(3)) without libsystemd: datagrams to $NOTIFY_SOCKET.

READY=1 goes out only after the probes attached; WATCHDOG=1 from the main loop at half the
interval systemd asked for (WATCHDOG_USEC); STOPPING=1 on SIGTERM; RELOADING=1 around a
SIGHUP. Outside systemd (no NOTIFY_SOCKET) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET", "")
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        # WATCHDOG_PID names the process systemd watches; another one must stay silent.
        watched = not pid or pid == str(os.getpid())
        self.watchdog_interval_s = int(usec) / 2e6 if usec.isdigit() and watched else 0.0
        self._last_watchdog = 0.0
        self._sock: socket.socket | None = None

    def send(self, *fields: str) -> bool:
        """Send KEY=VALUE lines in one datagram; False when not under systemd or it failed."""
        if not self.address:
            return False
        target = self.address
        if target.startswith("@"):  # abstract namespace
            target = "\0" + target[1:]
        if self._sock is None:
            # Non-blocking: a manager that stops reading must not stop the main loop (a
            # lost datagram is at worst a missed watchdog ping, and the next one follows).
            self._sock = socket.socket(
                socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
            )
        try:
            self._sock.sendto("\n".join(fields).encode(), target)
        except OSError:
            return False
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def reloading(self) -> bool:
        monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")

    def watchdog(self, now_s: float | None = None) -> bool:
        """Pet the watchdog if half its interval has passed; call from the main loop."""
        if not self.watchdog_interval_s:
            return False
        now = time.monotonic() if now_s is None else now_s
        if now - self._last_watchdog < self.watchdog_interval_s:
            return False
        self._last_watchdog = now
        return self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
