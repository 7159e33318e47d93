"""Misbehaving clients and a short system against the stream socket and the metrics endpoint,
over real sockets: descriptors running out, a client whose step fails, idle clients filling
the caps, garbage requests, requests in a loop, over-long request lines, half-closed and
far-behind clients, a daemon trickling bytes, bare-LF HTTP, a too-long socket path.
The daemon must go on serving, say what is wrong in one line and count only what it drops."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import shutil
import socket
import stat
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil
import pytest

from gpujitter.daemon.service.runtime import ListSource, Runtime
from gpujitter.daemon.sinks import stream
from gpujitter.daemon.sinks.metrics_server import MetricsServer
from gpujitter.daemon.sinks.stream import (
    BAD_REQUESTS,
    LEAVE_S,
    MAX_CLIENTS,
    MAX_PER_UID,
    REQUEST_BURST,
    REQUESTS_PER_S,
    ROOT_ROOM,
    StreamServer,
    first_records,
)
from gpujitter.errors import GpujitterError
from gpujitter.probes.topology import load_topology
from tests.unit.test_metrics import free_port
from tests.unit.test_stream import connect, read_lines, wait_for_clients


@contextlib.contextmanager
def no_descriptor_left() -> Iterator[None]:
    """This process can open no more files until the block ends: the soft RLIMIT_NOFILE
    at the lowest free descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowest = os.dup(0)
    os.close(lowest)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def read_all(sock: socket.socket) -> list[dict]:
    buf = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            buf += chunk
    return [orjson.loads(line) for line in buf.splitlines()]


# -- finding 2: out of descriptors, a failing client -----------------------------------------


def test_out_of_descriptors_refuses_in_one_line_and_the_stream_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """EMFILE in accept killed the server thread: no client was ever served again."""
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list).start()
    early = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(3)]
    try:
        with no_descriptor_left():
            for sock in early:
                sock.settimeout(2)
                sock.connect(str(srv.path))
            said = [read_all(sock) for sock in early]
        assert said == [[{"type": "error", "message": "the daemon is out of file descriptors"}]] * 3
        assert srv.refused == 3 and srv.clients == 0
        assert capsys.readouterr().err.count("out of file descriptors") == 1  # said once
        late = connect(srv.path)  # descriptors free again: served as ever
        assert read_lines(late, 1)[0]["type"] == "hello"
        late.close()
    finally:
        for sock in early:
            sock.close()
        srv.close()


def test_a_client_whose_step_fails_is_dropped_and_the_others_are_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An exception in a client's step (here the snapshot callback, on connect and on request)
    ended the server thread silently: the daemon ran on with a dead stream."""
    monkeypatch.setattr(stream, "SNAPSHOT_EVERY_S", 0.0)
    failing = [True]

    def snapshot() -> list[dict]:
        if failing[0]:
            raise RuntimeError("a bug")
        return [{"type": "snapshot"}]

    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=snapshot).start()
    try:
        first = connect(srv.path)
        assert read_all(first) == []  # dropped on connect
        failing[0] = False
        second = connect(srv.path)
        assert [r["type"] for r in read_lines(second, 2)] == ["hello", "snapshot"]
        failing[0] = True
        second.sendall(b'{"cmd": "snapshot"}\n')
        assert read_all(second) == []  # dropped on its request
        failing[0] = False
        third = connect(srv.path)
        assert [r["type"] for r in read_lines(third, 2)] == ["hello", "snapshot"]
        err = capsys.readouterr().err
        assert "RuntimeError: a bug" in err and "Traceback" not in err
        for sock in (first, second, third):
            sock.close()
    finally:
        srv.close()


def test_a_failed_footprint_read_keeps_the_last_values() -> None:
    """Out of descriptors, psutil's read of /proc/PID/stat raised EMFILE in the main loop's
    tick, and the daemon ended with "internal error". The CPU time needs no descriptor (the
    process's CPU clock): it is measured all the same."""

    class Unreadable:
        def __init__(self, err: Exception) -> None:
            self.err = err

        @contextlib.contextmanager
        def oneshot(self) -> Iterator[None]:
            yield

        def memory_info(self) -> None:
            raise self.err

    runtime = Runtime(ListSource([], live=True), load_topology())
    runtime._cpu_percent, runtime._rss_bytes = -3.5, 1 << 20
    for err in (OSError(errno.EMFILE, "Too many open files"), psutil.NoSuchProcess(os.getpid())):
        runtime._me = Unreadable(err)  # type: ignore[assignment]
        runtime._tick(time.monotonic_ns(), 1.0)
        assert runtime._rss_bytes == 1 << 20 and runtime._cpu_percent >= 0


def test_metrics_endpoint_out_of_descriptors_waits_rather_than_spins() -> None:
    """The listener stayed in the selector while accept failed: the thread spun at a full
    CPU for as long as descriptors were short."""
    port = free_port()
    server = MetricsServer("127.0.0.1", port, lambda: b"up 1\n", closed=lambda reason: None)
    scraper = socket.socket()
    scraper.settimeout(2)
    server.start()
    try:
        with no_descriptor_left():
            scraper.connect(("127.0.0.1", port))
            scraper.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            cpu = time.process_time()
            time.sleep(0.5)
            spent = time.process_time() - cpu
        assert spent < 0.15  # a spinning thread takes all of the 0.5 s
        assert scraper.recv(4096).startswith(b"HTTP/1.1 200")  # answered once fds are free
    finally:
        scraper.close()
        server.close()


# -- finding 3: idle clients filling the caps -----------------------------------------------


def test_one_user_cannot_lock_out_others_or_root(tmp_path: Path) -> None:
    """63 idle connections from one user locked everyone out, root included."""
    uids: list[int] = []  # the uid each next connection comes as
    srv = StreamServer(
        tmp_path / "s.sock", hello=dict, snapshot=list, credentials=lambda sock: (1, uids.pop(0), 1)
    ).start()
    socks: list[socket.socket] = []

    def comes_as(uid: int) -> list[dict]:
        uids.append(uid)
        socks.append(connect(srv.path))
        return read_lines(socks[-1], 1)

    try:
        for _ in range(MAX_PER_UID):
            assert comes_as(1000)[0]["type"] == "hello"
        assert comes_as(1000) == [
            {"type": "error", "message": f"too many clients for uid 1000 (at most {MAX_PER_UID})"}
        ]
        others = 1001  # the next users, MAX_PER_UID connections each
        while srv.clients < MAX_CLIENTS - ROOT_ROOM:
            assert comes_as(others)[0]["type"] == "hello"
            if srv.clients % MAX_PER_UID == 0:
                others += 1
        assert comes_as(others)[0]["message"] == "too many clients (the rest are kept for root)"
        for _ in range(ROOT_ROOM):
            assert comes_as(0)[0]["type"] == "hello"
        assert comes_as(0) == [{"type": "error", "message": "too many clients"}]
        assert srv.refused == 3
    finally:
        for sock in socks:
            sock.close()
        srv.close()


def test_first_records_says_why_the_daemon_refused(tmp_path: Path) -> None:
    """`gpujitter top --json` said "sent no snapshot within 5 s" and threw the reason away."""
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list, max_clients=1).start()
    kept = connect(srv.path)
    try:
        wait_for_clients(srv, 1)
        with pytest.raises(GpujitterError, match=r"refused the connection: too many clients$"):
            first_records(srv.path, ["snapshot"], timeout_s=1.0)
    finally:
        kept.close()
        srv.close()


# -- a connect/disconnect loop ----------------------------------------------------------------


def test_connections_waiting_together_share_one_snapshot(tmp_path: Path) -> None:
    """Each connection built a snapshot of its own: a client connecting and disconnecting in
    a loop held the daemon at 60 % of a CPU. Those that wait together are admitted in one
    round, with one snapshot, each still with its own user's scope."""
    built: list[int] = []
    uids = [0, 1000, 0, 1000, 1001, 0]
    srv = StreamServer(
        tmp_path / "s.sock",
        hello=dict,
        snapshot=lambda: built.append(1) or [{"type": "snapshot", "records": []}],
        credentials=lambda sock: (1, uids.pop(0), 1),
    )
    socks = [connect(srv.path) for _ in range(6)]  # in the backlog: the server is not started
    try:
        srv.start()
        firsts = [read_lines(sock, 2) for sock in socks]
        assert built == [1]
        assert [first[0]["scope"] for first in firsts] == [
            "all", "uid 1000", "all", "uid 1000", "uid 1001", "all"
        ]  # fmt: skip
        assert all(first[1]["type"] == "snapshot" for first in firsts)
    finally:
        for sock in socks:
            sock.close()
        srv.close()


def test_a_connect_loop_costs_a_snapshot_a_second_not_one_a_round(tmp_path: Path) -> None:
    """A snapshot built for each round of admission (~270 KB of JSON on a busy node): ~870
    connections a second held the daemon at 23-29 % of a CPU. A user's new clients share one
    opening for OPENING_S."""
    built: list[int] = []
    srv = StreamServer(tmp_path / "s.sock", hello=dict,
                       snapshot=lambda: built.append(1) or []).start()  # fmt: skip
    try:
        start = time.monotonic()
        connects = 0
        while time.monotonic() - start < 1.5:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(srv.path))
            sock.close()
            connects += 1
        took = time.monotonic() - start
        assert len(built) <= took / stream.OPENING_S + 1 < connects
        late = connect(srv.path)  # a client that stays is served as ever
        assert read_lines(late, 1)[0]["type"] == "hello"
        late.close()
    finally:
        srv.close()


def test_a_client_given_a_shared_opening_reads_what_was_published_since(tmp_path: Path) -> None:
    """A client admitted after others within OPENING_S gets their snapshot, then every record
    published since, then the live ones: what it reads adds up to now, as a client's that
    came with the snapshot would."""
    snapshot = [{"type": "snapshot"}]
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=lambda: snapshot).start()
    try:
        first = connect(srv.path)
        wait_for_clients(srv, 1)
        first.close()
        deadline = time.monotonic() + 5
        while srv.clients:  # gone: only its opening listens now
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert srv.listened()
        for n in range(3):
            srv.publish({"type": "gap", "n": n})
        time.sleep(stream.ADMIT_EVERY_S * 2)  # another round of admission
        second = connect(srv.path)
        wait_for_clients(srv, 1)
        srv.publish({"type": "gap", "n": 3})
        lines = read_lines(second, 6)
        assert [r["type"] for r in lines[:2]] == ["hello", "snapshot"]
        assert [r["n"] for r in lines[2:]] == [0, 1, 2, 3]
        second.close()
    finally:
        srv.close()


def test_clients_of_one_opening_share_its_bytes(tmp_path: Path) -> None:
    """Each new client's queue was joined into one buffer of its own to be sent, then copied
    again at each partial send: a connect loop with a 274 KB hello and snapshot took the
    daemon's RSS from 58 to 129 MiB, where it stayed. The snapshot is sent from the bytes
    encoded once, whatever the number of clients that have not read it yet."""
    big = [{"type": "snapshot", "gaps": [{"n": n, "pad": "x" * 1000} for n in range(1000)]}]
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=lambda: big)
    socks = [connect(srv.path) for _ in range(40)]  # in the backlog: one round, none reads
    tracemalloc.start()
    try:
        srv.start()
        wait_for_clients(srv, len(socks))
        time.sleep(0.2)  # each took what its socket's buffer holds
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        for sock in socks:
            sock.close()
        srv.close()
    # One encoding (1 MB, and orjson's buffer as it grows), not a copy or two a client.
    assert peak < 4_000_000


def test_a_full_backlog_makes_a_client_wait_for_a_slot_not_give_up(tmp_path: Path) -> None:
    """With a timeout set, a unix socket's connect() fails at once (EAGAIN) while the
    listener's backlog is full; the clients read that as "no daemon" (and `top` would then
    run its own probes beside the daemon). They wait for a slot now, up to their timeout."""
    from gpujitter.tui.feeds.socket import daemon_listening

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as busy:
        busy.bind(str(path))
        busy.listen(0)
        held = []
        while True:  # fill the backlog
            w = socket.socket(socket.AF_UNIX)
            w.setblocking(False)
            try:
                w.connect(str(path))
            except BlockingIOError:
                w.close()
                break
            held.append(w)
        start = time.monotonic()
        with pytest.raises(BlockingIOError):
            stream.connect(path, 0.3)
        assert 0.25 < time.monotonic() - start < 2
        assert daemon_listening(path)  # there, if busy
        threading.Timer(0.2, lambda: busy.accept()[0].close()).start()
        start = time.monotonic()
        stream.connect(path, 5.0).close()  # in as the listener takes one
        assert time.monotonic() - start < 2
        for w in held:
            w.close()


FLOOD = """
import socket, sys, time
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
    except OSError:
        pass
    s.close()
"""


def test_clients_get_in_beside_a_connect_and_close_loop(tmp_path: Path) -> None:
    """Two processes connecting and hanging up in a loop keep the backlog full between the
    admission rounds: `top --json`, `doctor` and `top`'s "is a daemon there?" were told
    there was none (EAGAIN), found by an audit of the daemon's socket."""
    import subprocess
    import sys

    from gpujitter.tui.feeds.socket import daemon_listening

    snapshot = [{"type": "snapshot"}]
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=lambda: snapshot).start()
    floods = [subprocess.Popen([sys.executable, "-c", FLOOD, str(srv.path), "4"]) for _ in range(2)]
    try:
        time.sleep(0.5)
        for _ in range(5):
            assert daemon_listening(srv.path)
            got = first_records(srv.path, ("hello", "snapshot"), 2.0)
            assert set(got) == {"hello", "snapshot"}
        assert all(f.poll() is None for f in floods)  # the loops ran throughout
    finally:
        for f in floods:
            f.kill()
            f.wait()
        srv.close()


# -- finding 6: garbage requests ---------------------------------------------------------------


def test_garbage_requests_close_the_connection_and_are_not_dropped_records(
    tmp_path: Path,
) -> None:
    """Garbage sent in a loop kept the daemon at a full CPU, and the error lines the client
    never read counted as records dropped for slow clients."""
    small = StreamServer(tmp_path / "q.sock", hello=dict, snapshot=list, queue_limit=4).start()
    try:
        pinger = connect(small.path)
        read_lines(pinger, 1)  # hello
        pinger.sendall(b'{"cmd": "ping"}\n' * 20)  # read together: more than the queue holds
        time.sleep(0.2)
        assert small.dropped_total == 0
        pinger.close()
    finally:
        small.close()
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list).start()
    try:
        garbage = connect(srv.path)
        garbage.settimeout(1)
        garbage.sendall(b"garbage\n" * (BAD_REQUESTS + 10))
        lines = read_all(garbage)  # the server closes it
        assert [r["type"] for r in lines] == ["hello"] + ["error"] * BAD_REQUESTS
        assert lines[-1]["message"].endswith(
            f"closing the connection after {BAD_REQUESTS} bad requests"
        )
        assert srv.dropped_total == 0
        garbage.close()
    finally:
        srv.close()


# -- the socket audit: requests in a loop, long lines, half-closes, far-behind clients ---------


def thread_cpu_s(thread: threading.Thread) -> float:
    mine = next(t for t in psutil.Process().threads() if t.id == thread.native_id)
    return float(mine.user_time + mine.system_time)


def test_requests_in_a_loop_are_read_at_the_budget_and_others_answered_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Valid pings sent in a loop and never read held the server thread at a full CPU (10 M
    parsed in 15 s): the bad-request limit counts bad requests only."""
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list).start()
    spammer, other = connect(srv.path), connect(srv.path)
    try:
        read_lines(spammer, 1)
        read_lines(other, 1)
        cpu_s = thread_cpu_s(srv._thread)
        spammer.setblocking(False)
        start = time.monotonic()
        while time.monotonic() - start < 1.0:
            with contextlib.suppress(BlockingIOError):
                spammer.send(b'{"cmd": "ping"}\n' * 256)
        assert thread_cpu_s(srv._thread) - cpu_s < 0.2  # it took all it could get
        asked = time.monotonic()
        other.sendall(b'{"cmd": "ping"}\n')
        assert read_lines(other, 1) == [{"type": "pong"}]
        assert time.monotonic() - asked < 0.2
        time.sleep(0.2)
        pongs = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := spammer.recv(1 << 20):
                pongs += chunk
        budget = REQUEST_BURST + (time.monotonic() - start + 0.1) * REQUESTS_PER_S
        assert 0 < pongs.count(b"pong") <= budget  # answered at the budget's pace, not closed
        assert capsys.readouterr().err.count("requests a second") == 1
    finally:
        spammer.close()
        other.close()
        srv.close()


def test_an_over_long_request_line_is_one_bad_request_and_its_tail_is_no_request(
    tmp_path: Path,
) -> None:
    """A line past the 64 KiB request buffer was cut where the buffer was cleared: a 70 KB
    line ending in a ping got an error and a pong, a 1 MiB line was 16 bad requests."""
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list).start()
    sock = connect(srv.path)
    try:
        read_lines(sock, 1)
        sock.sendall(b" " * 70_000 + b'{"cmd": "ping"}\n' + b"a" * (1 << 20) + b"\n")
        sock.sendall(b'{"cmd": "ping"}\n')
        too_long = {"type": "error", "message": "request line too long"}
        assert read_lines(sock, 3) == [too_long, too_long, {"type": "pong"}]
    finally:
        sock.close()
        srv.close()


def test_a_half_closed_client_gets_all_it_asked_for_then_the_end(tmp_path: Path) -> None:
    """`echo '{"cmd":"ping"}' | socat - UNIX-CONNECT:…` shuts its sending side: the daemon
    dropped it at once with all that was queued, cutting its snapshot mid-line, and the pong
    never came. A half-closed client that does not read goes when LEAVE_S is up."""
    big = {"type": "snapshot", "pad": "x" * 2_000_000}
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=lambda: [big]).start()
    asker, stuck = connect(srv.path), connect(srv.path)
    try:
        wait_for_clients(srv, 2)
        for sock in (asker, stuck):
            sock.sendall(b'{"cmd": "ping"}\n{"cmd": "ping"}')  # the last with no newline
            sock.shutdown(socket.SHUT_WR)
        time.sleep(0.2)  # the daemon reads the end before the client reads anything
        srv.publish({"type": "gap"})  # after the end: not for it
        assert [r["type"] for r in read_all(asker)] == ["hello", "snapshot", "pong", "pong"]
        start = time.monotonic()
        while srv.clients:
            assert time.monotonic() - start < LEAVE_S + 0.5, "a stuck client was kept"
            time.sleep(0.05)
    finally:
        asker.close()
        stuck.close()
        srv.close()


def test_a_client_far_behind_closed_for_bad_requests_reads_why(tmp_path: Path) -> None:
    """A client far behind that sent 16 bad requests was closed after one send: it never
    got the error lines, queued behind its backlog, and its stream ended mid-line. Now its
    queued records go (counted, and said in a "dropped" line) and the error is what it reads."""
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list, queue_limit=100).start()
    sock = connect(srv.path)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        wait_for_clients(srv, 1)
        n = 500
        for i in range(n):
            srv.publish({"type": "gap", "n": i, "pad": "y" * 2000})
        sock.sendall(b"x\n" * BAD_REQUESTS)
        time.sleep(0.2)
        lines = read_all(sock)  # whole lines only, to the daemon's close
        closing = f"; closing the connection after {BAD_REQUESTS} bad requests"
        assert lines[-1]["type"] == "error" and lines[-1]["message"].endswith(closing)
        gaps = [r for r in lines if r["type"] == "gap"]
        dropped = sum(r["count"] for r in lines if r["type"] == "dropped")
        assert dropped == srv.dropped_total and len(gaps) + dropped == n
    finally:
        sock.close()
        srv.close()


# -- finding 7: a trickling daemon ----------------------------------------------------------


def test_first_records_deadline_holds_against_a_trickle(tmp_path: Path) -> None:
    """The deadline was checked between lines only: a byte every 0.1 s kept each recv under
    its timeout, and `top --json` hung until a whole line came."""
    path = tmp_path / "trickle.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn, contextlib.suppress(OSError):
            conn.sendall(b'{"type": "snap')
            for _ in range(30):  # 3 s at most: a client that hangs on fails, not for ever
                if stop.wait(0.1):
                    break
                conn.sendall(b" ")

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    start = time.monotonic()
    try:
        assert first_records(path, ["snapshot"], timeout_s=0.5) == {}
        assert time.monotonic() - start < 1.0
    finally:
        stop.set()
        thread.join(3)
        listener.close()


# -- finding 12: bare LF ---------------------------------------------------------------------


def test_metrics_request_with_bare_lf_lines_is_answered() -> None:
    port = free_port()
    server = MetricsServer("127.0.0.1", port, lambda: b"up 1\n", closed=lambda reason: None)
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.5) as sock:
            sock.sendall(b"GET /metrics HTTP/1.0\nHost: x\n\n")
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b"up 1\n")
    finally:
        server.close()


# -- finding 13: a too-long socket path -------------------------------------------------------


def test_too_long_socket_path_says_so(tmp_path: Path) -> None:
    path = tmp_path / ("s" * 120 + ".sock")
    with pytest.raises(
        GpujitterError, match=r"path too long for a unix socket \(\d+ bytes, at most 107\)"
    ):
        StreamServer(path, hello=dict, snapshot=list)


def test_a_socket_removed_under_the_daemon_is_made_again_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rm` of the socket (or a clean-up of /run, its folder too) left the daemon unreachable
    to any new client, and nothing said so: `top` then read "no daemon" beside a running
    one. The socket is made again, with its mode, and said; those connected are served
    throughout."""
    monkeypatch.setattr(stream, "PATH_CHECK_S", 0.1)
    path = tmp_path / "run" / "s.sock"
    srv = StreamServer(path, hello=dict, snapshot=list, mode=0o640).start()
    try:
        client = connect(srv.path)
        read_lines(client, 1)
        path.unlink()
        said = wait_said(capsys, "listening there again")
        assert said == [f"gpujitter stream: socket {path} was removed: listening there again"]
        shutil.rmtree(path.parent)  # again, its folder too (said in the next line, 10 min on)
        deadline = time.monotonic() + 5
        while not path.is_socket() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.is_socket() and stat.S_IMODE(path.stat().st_mode) == 0o640
        with connect(path) as again:  # a new client reaches it
            assert read_lines(again, 1)
        srv.publish({"type": "gap"})  # the first is still served
        assert read_lines(client, 1) == [{"type": "gap"}]
        client.close()
    finally:
        srv.close()
    assert not path.exists()  # the socket it made again is its own to remove


def test_a_socket_path_taken_by_something_else_is_said_once_and_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(stream, "PATH_CHECK_S", 0.1)
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list).start()
    try:
        client = connect(srv.path)
        read_lines(client, 1)
        srv.path.unlink()
        srv.path.write_text("not a socket\n")  # in its place before the next look
        said = wait_said(capsys, "was replaced")
        assert said == [f"gpujitter stream: socket {srv.path} was replaced: new clients reach "
                        "what is there now, not this daemon, until it restarts"]  # fmt: skip
        srv.publish({"type": "gap"})  # those connected are still served
        assert read_lines(client, 1) == [{"type": "gap"}]
        time.sleep(0.5)
        assert capsys.readouterr().err == ""  # once
        client.close()
    finally:
        srv.close()
    assert srv.path.read_text() == "not a socket\n"  # not its own: left in place


def wait_said(capsys: pytest.CaptureFixture[str], words: str) -> list[str]:
    deadline = time.monotonic() + 5
    said = ""
    while words not in said and time.monotonic() < deadline:
        time.sleep(0.05)
        said += capsys.readouterr().err
    return said.splitlines()
