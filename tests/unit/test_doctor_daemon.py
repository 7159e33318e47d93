"""`doctor --load` asks a running daemon for its own account: a real stream server on a unix
socket stands in for the daemon (the status record as the runtime builds it), and the
failure paths are real sockets too (none there, a stale file, a daemon that says nothing)."""

from __future__ import annotations

import dataclasses
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpujitter.daemon.checks.doctor import DoctorEnv, Result, load
from gpujitter.daemon.service.status import DaemonStatus, ProbeCost
from gpujitter.daemon.sinks import stream
from gpujitter.daemon.sinks.stream import StreamServer, first_records


def cost(state: str = "running", events: int = 0, lost: int = 0) -> ProbeCost:
    return ProbeCost(state=state, bpf_ns_per_s=2_000_000, bpf_runs_per_s=4000,
                     cost_from="kernel", events=events, lost_kernel=lost, lost_user=0)  # fmt: skip


def status(**kw: object) -> DaemonStatus:
    fields: dict[str, object] = {
        "ts_ns": 1,
        "cpu_percent": 1.94,
        "rss_bytes": 93 << 20,
        "events_per_s": 451.2,
        "attributions": 12,
        "self_inflicted": 0,
        "own_cpus": (2, 3, 4, 5),
        "own_nice": 10,
        "probe_cost": {
            "sched": cost(events=900),
            "cuda": cost("degraded"),
            "nvml": cost("unavailable"),
            "swap": dataclasses.replace(
                cost(events=3), bpf_ns_per_s=-1, bpf_runs_per_s=-1, cost_from="with faults"
            ),
        },
    }
    fields.update(kw)
    return DaemonStatus(**fields)  # type: ignore[arg-type]


@pytest.fixture
def daemon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, dict]]:
    """A stream server whose snapshot carries `said["status"]` (a record), as the daemon's.
    Each connection gets a snapshot of its own: the tests change what it says between checks
    without publishing anything (the daemon's, shared for a tick, has its changes follow)."""
    monkeypatch.setattr(stream, "OPENING_S", 0.0)
    said: dict = {"status": status().to_record(), "hello": {"pid": 4242, "version": "9.9"}}
    srv = StreamServer(
        tmp_path / "gpujitter.sock",
        hello=lambda: dict(said["hello"]),
        snapshot=lambda: [{"type": "snapshot", "status": said["status"]}],
    ).start()
    yield srv.path, said
    srv.close()


def checks(path: Path | None, load_flag: bool = True) -> dict[str, Result]:
    env = DoctorEnv(load=load_flag, socket=path)
    return {r.check: r for r in load.check_daemon(env)}


def test_the_daemon_in_its_own_words(daemon: tuple[Path, dict]) -> None:
    path, _ = daemon
    got = checks(path)
    summary = got["daemon"]
    assert summary.status == "pass" and summary.source == str(path)
    assert summary.detail == (
        "pid 4242 (9.9): 1.9% of a CPU, 93 MiB resident, 451 events/s, 0 lost (0 in the "
        "kernel, 0 in user space), 12 gaps attributed, 0 self-inflicted; its threads at "
        "nice 10 on CPUs 2-5"
    )
    # Each probe's cost as the daemon measured it; a degraded probe warns, a source this
    # node cannot have (no GPU for NVML) is information.
    assert got["daemon sched"].status == "pass"
    assert got["daemon sched"].detail == (
        "running; BPF 4000 runs/s, 500 ns/run, 0.200% of a CPU (kernel), 900 events, 0 lost"
    )
    assert got["daemon cuda"].status == "warn"
    assert got["daemon nvml"].status == "info"
    assert list(got) == ["daemon", "daemon cuda", "daemon nvml", "daemon sched", "daemon swap"]
    # A probe whose cost is not its own to say (swap's programs are faults'), or was not
    # measured (a degraded cuda), still says what it delivered and lost.
    assert got["daemon swap"].detail == (
        "running; BPF cost counted with faults (the programs are shared), 3 events, 0 lost"
    )
    said = status().probe_cost["cuda"]
    said = dataclasses.replace(said, bpf_ns_per_s=-1, bpf_runs_per_s=-1, cost_from="",
                               events=5, lost_kernel=4)  # fmt: skip
    path, told = daemon
    told["status"] = status(probe_cost={"cuda": said}).to_record()
    assert checks(path)["daemon cuda"].detail == (
        "degraded; BPF cost not measured (statistics refused, or no BPF programs), 5 events, 4 lost"
    )


@pytest.mark.parametrize(
    ("changes", "says", "fix"),
    [
        ({"self_inflicted": 3, "self_inflicted_ns": 9_000_000}, "3 self-inflicted", "a CPU"),
        (
            {"lost_kernel": 7, "lost_user": 2},
            "9 lost (7 in the kernel, 2 in user space)",
            "probes.disable",
        ),
    ],
)
def test_a_daemon_that_delays_the_job_or_loses_events_warns(
    daemon: tuple[Path, dict], changes: dict, says: str, fix: str
) -> None:
    path, said = daemon
    said["status"] = status(**changes).to_record()
    summary = checks(path)["daemon"]
    assert summary.status == "warn" and says in summary.detail and fix in summary.fix


def test_an_older_daemon_that_does_not_count_self_inflicted_gaps(
    daemon: tuple[Path, dict],
) -> None:
    path, said = daemon
    record = status().to_record()
    del record["self_inflicted"]
    said["status"] = record
    summary = checks(path)["daemon"]
    assert summary.status == "pass" and "self-inflicted not counted" in summary.detail


def test_hostile_or_unreadable_fields_are_one_line(daemon: tuple[Path, dict]) -> None:
    path, said = daemon
    said["hello"] = {"pid": "x", "version": "1.0\x1b[2J"}
    assert "\x1b" not in checks(path)["daemon"].detail
    assert checks(path)["daemon"].detail.startswith("a daemon (1.0")
    said["status"] = {**status().to_record(), "cpu_percent": "lots"}
    (only,) = checks(path).values()
    assert only.status == "warn" and "cannot read" in only.detail and only.fix


def test_no_daemon_there_is_information(tmp_path: Path) -> None:
    (absent,) = checks(tmp_path / "none.sock").values()
    assert (absent.status, absent.detail) == (
        "info",
        f"no daemon listening at {tmp_path}/none.sock",
    )
    stale = tmp_path / "stale.sock"  # a daemon that died without removing its socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(stale))
    (refused,) = checks(stale).values()
    assert refused.status == "info" and "no daemon listening" in refused.detail


def test_only_asked_with_load(daemon: tuple[Path, dict]) -> None:
    path, _ = daemon
    assert checks(path, load_flag=False) == {}
    assert checks(None) == {}


def test_a_listener_that_says_nothing_is_given_up_on_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something listens but sends no snapshot (a wedged daemon, another program): the
    doctor waits DAEMON_TIMEOUT_S, then says so."""
    monkeypatch.setattr(load, "DAEMON_TIMEOUT_S", 0.3)
    path = tmp_path / "mute.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    accepted: list[socket.socket] = []
    t = threading.Thread(target=lambda: accepted.append(listener.accept()[0]))
    t.start()
    try:
        (mute,) = checks(path).values()
    finally:
        t.join(5)
        for s in (*accepted, listener):
            s.close()
    assert mute.status == "warn" and "sent no status within" in mute.detail


def test_first_records_takes_the_first_of_each_type(daemon: tuple[Path, dict]) -> None:
    path, _ = daemon
    got = first_records(path, ("hello", "snapshot", "never"), timeout_s=0.5)
    assert set(got) == {"hello", "snapshot"}
    assert got["hello"]["pid"] == 4242 and got["snapshot"]["status"]["attributions"] == 12
    with pytest.raises(FileNotFoundError):
        first_records(path.with_name("gone.sock"), ("hello",), timeout_s=0.5)
