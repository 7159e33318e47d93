"""The daemon's unix-socket stream, over real sockets: order, slow clients, peer
credentials, requests, permissions."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gpujitter.daemon.sinks.stream import SNAPSHOT_BUILDS_PER_S, STREAM_SCHEMA, StreamServer


@pytest.fixture
def server(tmp_path: Path) -> Iterator[StreamServer]:
    srv = StreamServer(
        tmp_path / "run" / "gpujitter.sock",
        hello=lambda: {"host": "test"},
        snapshot=lambda: [{"type": "snapshot", "cpus": 2}],
        queue_limit=50,
    ).start()
    yield srv
    srv.close()


def connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    sock.settimeout(5)
    return sock


def read_lines(sock: socket.socket, n: int) -> list[dict]:
    buf = b""
    while buf.count(b"\n") < n:
        chunk = sock.recv(65536)
        if not chunk:
            break
        buf += chunk
    return [orjson.loads(line) for line in buf.split(b"\n")[:n]]


def wait_for_clients(srv: StreamServer, n: int) -> None:
    deadline = time.monotonic() + 5
    while srv.clients < n:
        assert time.monotonic() < deadline, "client never registered"
        time.sleep(0.01)


def test_hello_then_snapshot_then_live_records_in_order(server: StreamServer) -> None:
    sock = connect(server.path)
    wait_for_clients(server, 1)
    for i in range(5):
        server.publish({"type": "gap", "n": i})
    lines = read_lines(sock, 7)
    assert lines[0]["type"] == "hello" and lines[0]["schema"] == STREAM_SCHEMA
    assert lines[0]["host"] == "test" and lines[0]["scope"] == "all"
    assert lines[1] == {"type": "snapshot", "cpus": 2}
    assert [rec["n"] for rec in lines[2:]] == [0, 1, 2, 3, 4]
    sock.close()


def test_names_chosen_by_other_processes_reach_a_reader_escaped(server: StreamServer) -> None:
    # A process names itself; a reader prints the stream as it comes (socat, nc).
    hostile = "\x9b31m\u202eevil\x7f\u2028\x1b]0;x\x07"
    sock = connect(server.path)
    wait_for_clients(server, 1)
    server.publish({"type": "gap", "comm": hostile})
    buf = b""
    while buf.count(b"\n") < 3:
        buf += sock.recv(65536)
    raw = buf.split(b"\n")[2]
    assert raw.isascii() and b"\x7f" not in raw and b"\x1b" not in raw, raw
    assert orjson.loads(raw)["comm"] == hostile  # the same value, only written escaped
    sock.close()


def test_what_is_published_just_before_close_still_reaches_clients(
    server: StreamServer,
) -> None:
    """The daemon publishes the attributions it decides while stopping, then closes: more
    than the socket buffers hold, so most of it is still queued when close begins."""
    sock = connect(server.path)
    wait_for_clients(server, 1)
    read_lines(sock, 2)  # hello, snapshot
    got: list[dict] = []
    reader = threading.Thread(target=lambda: got.extend(read_lines(sock, 40)))
    reader.start()
    for i in range(40):
        server.publish({"type": "gpu.attribution", "n": i, "pad": "x" * 20_000})
    server.close()
    reader.join(timeout=10)
    assert [r["n"] for r in got] == list(range(40))


def test_slow_client_loses_counted_records_and_never_blocks_the_publisher(
    server: StreamServer,
) -> None:
    slow = connect(server.path)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    wait_for_clients(server, 1)
    payload = "x" * 2000
    n = 3000  # far more than the socket buffers and the 50-record queue hold
    for i in range(n):
        server.publish({"type": "gap", "n": i, "pad": payload})
    assert server.dropped_total > 0
    received, dropped_notices = 0, 0

    def drain(until_n: int | None) -> None:
        nonlocal received, dropped_notices
        buf = b""
        slow.settimeout(0.5)
        while True:
            try:
                chunk = slow.recv(1 << 20)
            except TimeoutError:
                if until_n is None:
                    return  # quiet: the queue is empty
                continue
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                rec = orjson.loads(line)
                if rec["type"] == "gap":
                    received += 1
                    if rec["n"] == until_n:
                        return
                elif rec["type"] == "dropped":
                    dropped_notices += rec["count"]

    drain(None)
    server.publish({"type": "gap", "n": n, "pad": ""})  # the first record after the loss
    drain(n)
    assert dropped_notices == server.dropped_total
    assert received + dropped_notices == n + 1
    slow.close()


def test_requests_ping_snapshot_and_bad_input(server: StreamServer) -> None:
    sock = connect(server.path)
    read_lines(sock, 2)
    sock.sendall(b'{"cmd": "ping"}\nnot json\n{"cmd": "snapshot"}\n{"cmd": "shutdown"}\n')
    replies = read_lines(sock, 4)
    assert replies[0] == {"type": "pong"}
    assert replies[1]["type"] == "error" and "bad request" in replies[1]["message"]
    # A snapshot asked for within a second of the last one comes when its second is up.
    assert replies[2]["type"] == "error" and replies[3] == {"type": "snapshot", "cpus": 2}
    sock.close()


def test_snapshots_asked_for_in_a_loop_are_built_once_a_second(tmp_path: Path) -> None:
    built = []
    srv = StreamServer(
        tmp_path / "s.sock", hello=dict, snapshot=lambda: built.append(1) or [{"type": "snapshot"}]
    ).start()
    sock = connect(srv.path)
    read_lines(sock, 2)  # hello, snapshot

    def drain() -> None:  # a client that reads as fast as it asks
        with contextlib.suppress(OSError):
            while sock.recv(65536):
                pass

    sock.settimeout(None)  # blocking, so that a send with MSG_DONTWAIT returns at once
    threading.Thread(target=drain, daemon=True).start()
    start = time.monotonic()
    while time.monotonic() - start < 2.5:
        with contextlib.suppress(BlockingIOError):  # past its request budget: sends wait
            sock.send(b'{"cmd": "snapshot"}\n', socket.MSG_DONTWAIT)
        time.sleep(0.01)
    assert 2 <= len(built) <= 4  # the first one, then about one a second
    sock.close()
    srv.close()


def test_snapshots_asked_for_by_many_clients_are_built_a_few_times_a_second_in_all(
    tmp_path: Path,
) -> None:
    """Each client may have one a second, but not each at the daemon's cost: 56 clients that
    asked in a loop held 59 % of a CPU. Builds are SNAPSHOT_BUILDS_PER_S for all of them; one
    serves every client of its user whose request is due, and none is passed over."""
    built: list[float] = []
    uids = iter([0, 0, 0, 1000, 1000, 1001])
    srv = StreamServer(
        tmp_path / "s.sock",
        hello=dict,
        snapshot=lambda: built.append(time.monotonic()) or [{"type": "snapshot"}],
        credentials=lambda sock: (1, next(uids), 0),
    ).start()
    socks = [connect(srv.path) for _ in range(6)]
    wait_for_clients(srv, 6)
    admitted = len(built)  # the hellos' rounds: one build each
    got = [0] * len(socks)

    def drain(i: int) -> None:  # a client that reads as fast as it asks
        buf = b""
        with contextlib.suppress(OSError):
            while chunk := socks[i].recv(65536):
                buf += chunk
                got[i] = buf.count(b'"snapshot"') - 1  # past the one it was admitted with

    for i, sock in enumerate(socks):
        sock.settimeout(None)
        threading.Thread(target=drain, args=(i,), daemon=True).start()
    start = time.monotonic()
    while time.monotonic() - start < 3.0:
        for sock in socks:
            with contextlib.suppress(BlockingIOError):
                sock.send(b'{"cmd": "snapshot"}\n', socket.MSG_DONTWAIT)
        time.sleep(0.01)
    asked = len(built) - admitted
    assert 3 <= asked <= 3.0 * SNAPSHOT_BUILDS_PER_S + 1, built
    time.sleep(0.2)
    assert all(n >= 1 for n in got), got  # every client was served, root's three by one build
    assert sum(got) > asked, (got, asked)
    for sock in socks:
        sock.close()
    srv.close()


def test_non_root_client_sees_node_records_and_only_its_own_processes() -> None:
    nobody = 65534
    rundir = Path(tempfile.mkdtemp(prefix="gpujitter-stream-"))
    rundir.chmod(0o755)  # pytest's tmp_path is private to root; nobody must reach the socket
    mine, theirs = 1000, 1001
    srv = StreamServer(
        rundir / "gpujitter.sock",
        hello=dict,
        snapshot=lambda: [
            {"type": "attribution", "tgids": [theirs]},
            {"type": "attribution", "tgids": [mine]},
            {"type": "snapshot", "gaps": [{"tgids": [theirs]}, {"tgids": [mine]}], "cpus": [1]},
        ],
        mode=0o666,
        owner=lambda tgid: {mine: nobody, theirs: 0}.get(tgid),
    ).start()
    read_r, read_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the client, as user nobody
        try:
            os.close(read_r)
            os.setgid(nobody)
            os.setuid(nobody)
            sock = connect(srv.path)
            lines = read_lines(sock, 8)
            os.write(read_w, orjson.dumps(lines))
        finally:
            os._exit(0)
    os.close(read_w)
    try:
        wait_for_clients(srv, 1)
        srv.publish({"type": "attribution", "tgids": [theirs], "n": 1}, tgids=[theirs])
        srv.publish({"type": "cpu", "n": 2})
        srv.publish({"type": "attribution", "tgids": [mine], "n": 3}, tgids=[mine])
        srv.publish({"type": "probe", "n": 4})
        # Node-wide records that list processes: the entries of others' processes go.
        threads = [{"tid": 7, "tgid": theirs}, {"tid": 8, "tgid": mine}]
        srv.publish({"type": "daemon.status", "n": 5, "threads": threads})
        srv.publish({"type": "meta.watch", "n": 6, "added": [theirs, mine], "removed": []})
        got = orjson.loads(os.fdopen(read_r, "rb").read())
    finally:
        os.waitpid(pid, 0)
        srv.close()
        shutil.rmtree(rundir)
    assert got[0]["type"] == "hello" and got[0]["scope"] == f"uid {nobody}"
    assert got[1] == {"type": "attribution", "tgids": [mine]}  # snapshot, filtered
    # inside a snapshot record, the listed records about other users' processes go too
    assert got[2] == {"type": "snapshot", "gaps": [{"tgids": [mine]}], "cpus": [1]}
    assert [rec["n"] for rec in got[3:]] == [2, 3, 4, 5, 6]
    assert got[6]["threads"] == [{"tid": 8, "tgid": mine}]
    assert got[7]["added"] == [mine]


def test_owners_are_looked_up_once_a_second_not_once_a_record(tmp_path: Path) -> None:
    """Each status sent to a user other than root looked up the owner of each of its
    thousands of threads (a stat of /proc/PID each), every second and for every snapshot."""
    looked_up: list[int] = []

    def owner(tgid: int) -> int:
        looked_up.append(tgid)
        return 1000 if tgid % 2 else 0

    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list, owner=owner,
                       credentials=lambda sock: (1, 1000, 1000)).start()  # fmt: skip
    sock = connect(srv.path)
    try:
        wait_for_clients(srv, 1)
        threads = [{"tid": tid, "tgid": tid} for tid in range(2000)]
        for _ in range(5):
            srv.publish({"type": "daemon.status", "threads": threads})
        statuses = read_lines(sock, 6)[1:]
        assert [len(status["threads"]) for status in statuses] == [1000] * 5
        assert len(looked_up) <= 2 * 2000  # a second may have turned over meanwhile
    finally:
        sock.close()
        srv.close()


def test_root_is_answered_at_once_while_records_are_redacted_for_another_user(
    tmp_path: Path,
) -> None:
    """Redaction for users other than root ran under the lock that every client's reads and
    writes take: a root ping waited for it (260 ms while a user asked for snapshots)."""

    def owner(tgid: int) -> int:
        time.sleep(0.001)  # /proc on a busy node
        return 1000

    uids = [1000, 0]
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list, owner=owner,
                       credentials=lambda sock: (1, uids.pop(0), 1)).start()  # fmt: skip
    user = connect(srv.path)
    wait_for_clients(srv, 1)
    root = connect(srv.path)
    stop = threading.Event()

    def publish() -> None:  # the daemon's main thread: new processes each time
        first = 0
        while not stop.is_set():
            threads = [{"tid": t, "tgid": t} for t in range(first, first + 200)]
            srv.publish({"type": "daemon.status", "threads": threads})
            first += 200

    publisher = threading.Thread(target=publish)
    try:
        read_lines(root, 1)
        publisher.start()
        waits = []
        for _ in range(5):
            asked = time.monotonic()
            root.sendall(b'{"cmd": "ping"}\n')
            got = b""  # statuses, then the pong
            while b'{"type":"pong"}' not in got and time.monotonic() - asked < 5:
                got += root.recv(1 << 20)
            waits.append(time.monotonic() - asked)
        assert max(waits) < 0.1
    finally:
        stop.set()
        if publisher.is_alive():
            publisher.join()
        user.close()
        root.close()
        srv.close()


def test_socket_mode_and_removal(tmp_path: Path) -> None:
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list, mode=0o660).start()
    assert stat.S_IMODE(srv.path.stat().st_mode) == 0o660
    srv.close()
    assert not srv.path.exists()


def test_stale_socket_is_replaced_and_missing_group_is_one_line(tmp_path: Path) -> None:
    from gpujitter.errors import GpujitterError

    path = tmp_path / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    StreamServer(path, hello=dict, snapshot=list).start().close()
    with pytest.raises(GpujitterError, match="socket group 'no-such-group' does not exist"):
        StreamServer(path, hello=dict, snapshot=list, group="no-such-group")


def test_a_socket_a_daemon_serves_is_not_taken_over(tmp_path: Path) -> None:
    """A second daemon on the same path unlinked the first one's socket, served its clients,
    and removed the path at its exit: the first, still running, was unreachable for good."""
    from gpujitter.errors import GpujitterError

    path = tmp_path / "s.sock"
    first = StreamServer(path, hello=lambda: {"pid": 1}, snapshot=list).start()
    try:
        with pytest.raises(GpujitterError, match="a gpujitter daemon is already serving it"):
            StreamServer(path, hello=lambda: {"pid": 2}, snapshot=list)
        # Its socket removed by hand and another daemon bound there since: the first's
        # exit leaves the other's socket in place.
        path.unlink()
        second = StreamServer(path, hello=lambda: {"pid": 2}, snapshot=list).start()
        first.close()
        assert path.is_socket()
        with connect(path) as c:
            assert orjson.loads(c.makefile("rb").readline())["pid"] == 2
        second.close()
        assert not path.exists()
    finally:
        first.close()
    # A daemon whose backlog is full (a flood, a pause while out of descriptors) answers a
    # connection with EAGAIN at once: that read as "nobody there", and the socket was taken.
    with socket.socket(socket.AF_UNIX) as busy:
        busy.bind(str(path))
        busy.listen(0)
        waiting = [socket.socket(socket.AF_UNIX) for _ in range(2)]
        for w in waiting:
            w.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                w.connect(str(path))
        with pytest.raises(GpujitterError, match="already serving it"):
            StreamServer(path, hello=dict, snapshot=list)
        for w in waiting:
            w.close()


def test_publish_never_blocks_on_a_server_thread_that_does_not_run(tmp_path: Path) -> None:
    """Each publish wakes the server thread through a socket pair; when that thread is not
    reading (stalled, or dead), the pair fills up and a blocking send would stop the
    daemon's main loop for good."""
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list)  # never started
    done = threading.Event()

    def publish_many() -> None:
        for i in range(200_000):
            srv.publish({"type": "gap", "n": i})
        done.set()

    threading.Thread(target=publish_many, daemon=True).start()
    assert done.wait(30), "publish blocked on the wake-up socket"
    srv.close()


def test_clients_connecting_while_state_changes_all_get_their_snapshot(tmp_path: Path) -> None:
    """The daemon's state is fed on the main thread while the stream's thread builds a new
    client's snapshot from it: the snapshot must see a consistent copy (it once died of
    "deque mutated during iteration", and the main thread then hung)."""
    from gpujitter.daemon.analysis.records import Attribution
    from gpujitter.daemon.service.state import NodeState
    from gpujitter.probes.topology import Topology

    state = NodeState(Topology(cpu_node={0: 0, 1: 0}))
    srv = StreamServer(
        tmp_path / "s.sock",
        hello=dict,
        snapshot=lambda: [state.snapshot(time.monotonic_ns(), state.status(0))],
    ).start()
    stop = threading.Event()

    def feed() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            attr = Attribution(
                ts_ns=n, end_ns=n + 1, gpu=0, sources=("cuda",), resolution_ns=1,
                confidence=1.0, parts=(), tgids=(1,),
            )  # fmt: skip
            state.observe(attr)
            srv.publish({"type": "gpu.attribution", "n": n})

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        for _ in range(40):
            sock = connect(srv.path)
            first = read_lines(sock, 2)
            assert [r["type"] for r in first] == ["hello", "snapshot"]
            sock.close()
    finally:
        stop.set()
        feeder.join()
        srv.close()


def test_a_client_that_never_reads_holds_bounded_bytes(tmp_path: Path) -> None:
    """Asking for snapshots (238 KB each on a busy node) and never reading once grew the
    daemon by 470 MB in 30 s: the per-client bound counted records, not bytes."""
    big = {"type": "snapshot", "pad": "x" * 200_000}
    srv = StreamServer(
        tmp_path / "s.sock", hello=dict, snapshot=lambda: [big], queue_bytes=1 << 20
    ).start()
    sock = connect(srv.path)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    wait_for_clients(srv, 1)
    sock.sendall(b'{"cmd": "snapshot"}\n' * 200)
    for i in range(2000):
        srv.publish({"type": "gap", "n": i, "pad": "y" * 2000})
    time.sleep(0.5)
    assert srv.backlog_bytes <= (1 << 20) + len(orjson.dumps(big)) + 100
    assert srv.dropped_total > 0
    sock.close()
    srv.close()


def test_close_gives_all_stuck_clients_one_deadline_together(tmp_path: Path) -> None:
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list).start()
    stuck = [connect(srv.path) for _ in range(10)]
    wait_for_clients(srv, 10)
    for i in range(3000):
        srv.publish({"type": "gap", "n": i, "pad": "z" * 1000})
    time.sleep(0.3)  # their socket buffers filled: ~3 MB each waits in its queue
    tracemalloc.start()
    t0 = time.monotonic()
    srv.close()
    assert time.monotonic() - t0 < 3  # 10 clients, not 10 s
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # Their queues are not copied for sends that never come (one copy each: +30 MB).
    assert peak < 1 << 20
    for sock in stuck:
        sock.close()


def test_too_many_clients_are_refused_in_one_line(tmp_path: Path) -> None:
    srv = StreamServer(tmp_path / "s.sock", hello=dict, snapshot=list, max_clients=2).start()
    kept = [connect(srv.path) for _ in range(2)]
    wait_for_clients(srv, 2)
    extra = connect(srv.path)
    assert read_lines(extra, 1) == [{"type": "error", "message": "too many clients"}]
    assert srv.refused == 1 and srv.clients == 2
    for sock in [*kept, extra]:
        sock.close()
    srv.close()
