"""sd_notify against a socket of our own (systemd is not PID 1 here)."""

from __future__ import annotations

import dataclasses
import os
import socket
from pathlib import Path

import pytest

from gpujitter.daemon.service.sdnotify import Notifier
from gpujitter.daemon.service.status import DaemonStatus


@pytest.fixture
def notify_socket(tmp_path: Path):  # type: ignore[no-untyped-def]
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    yield path, sock
    sock.close()


def test_ready_status_and_stopping_reach_the_socket(notify_socket) -> None:  # type: ignore[no-untyped-def]
    path, sock = notify_socket
    n = Notifier({"NOTIFY_SOCKET": str(path)})
    assert n.ready("probes attached: sched, irq")
    assert sock.recv(4096).decode().split("\n") == ["READY=1", "STATUS=probes attached: sched, irq"]
    assert n.stopping()
    assert sock.recv(4096) == b"STOPPING=1"
    assert n.reloading()
    fields = sock.recv(4096).decode().split("\n")
    assert fields[0] == "RELOADING=1" and fields[1].startswith("MONOTONIC_USEC=")


def test_watchdog_pets_at_half_the_interval(notify_socket) -> None:  # type: ignore[no-untyped-def]
    path, sock = notify_socket
    n = Notifier({"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "10000000"})
    assert n.watchdog_interval_s == 5.0
    assert n.watchdog(now_s=100.0)
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert not n.watchdog(now_s=104.9)
    assert n.watchdog(now_s=105.0)
    assert sock.recv(4096) == b"WATCHDOG=1"


def test_watchdog_for_another_pid_stays_silent(notify_socket) -> None:  # type: ignore[no-untyped-def]
    path, _ = notify_socket
    n = Notifier(
        {
            "NOTIFY_SOCKET": str(path),
            "WATCHDOG_USEC": "10000000",
            "WATCHDOG_PID": str(os.getpid() + 1),
        }
    )
    assert not n.watchdog(now_s=100.0)


def test_abstract_socket_address() -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"gpujitter-test-{os.getpid()}"
    sock.bind("\0" + name)
    sock.settimeout(2)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).ready()
        assert sock.recv(4096) == b"READY=1"
    finally:
        sock.close()


def test_without_systemd_everything_is_a_no_op() -> None:
    n = Notifier({})
    assert not n.ready() and not n.watchdog(now_s=1.0) and not n.stopping()


def test_status_line_says_what_systemctl_status_should_show() -> None:
    """`systemctl status` showed no live status after start: each tick now sends STATUS= from
    the status record, with a failing disk named."""
    from gpujitter.daemon.service.runtime import status_line

    status = DaemonStatus(
        ts_ns=1, attributions=12, events_per_s=840.4, lost_kernel=0, lost_user=3, clients=2,
        cpu_percent=1.25, rss_bytes=131 << 20, self_inflicted=1,
    )  # fmt: skip
    line = status_line(status)
    assert line == (
        "12 gaps attributed; 840 events/s; lost 3; self-inflicted 1; 2 clients; cpu 1.2%; "
        "rss 131 MiB"
    )
    full = dataclasses.replace(
        status, log_failing="cannot write log /l: No space left", log_dropped=4
    )
    assert status_line(full).endswith(
        "; log failing (4 dropped): cannot write log /l: No space left"
    )
