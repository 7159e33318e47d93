"""Every bad setting of `gpujitter run` (file, environment or flag), and the same options of
`record`, `probe`, `gaps` and `top`, is refused in one line with exit status 2 before a probe
is attached: the daemon's run loop (which starts the probes) or the probe thread of the
other commands fails the test if it is reached."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpujitter import cli
from gpujitter.daemon.service.service import Daemon
from gpujitter.daemon.sinks.jsonlog import JsonLog
from gpujitter.daemon.sinks.stream import StreamServer


class Attached(Exception):
    """Raised where probes would start: the bad value was not refused before."""


def _poison(*args: Any, **kwargs: Any) -> None:
    raise Attached


@pytest.fixture(autouse=True)
def _no_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("GPUJITTER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(Daemon, "run", _poison)
    monkeypatch.setattr("gpujitter.daemon.service.head_start.compile_ahead", _poison)
    monkeypatch.setattr("gpujitter.probes.runner.ProbeThread", _poison)
    monkeypatch.setattr("gpujitter.tui.feeds.embedded.EmbeddedFeed", _poison)


def toml_of(settings: dict[str, Any]) -> str:
    tables: dict[str, list[str]] = {}
    for key, value in settings.items():
        table, _, name = key.partition(".")
        if isinstance(value, dict):
            text = "{ " + ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in value.items())
            text += " }"
        else:
            text = json.dumps(value)
        tables.setdefault(table, []).append(f"{name} = {text}")
    return "".join(f"[{t}]\n" + "\n".join(lines) + "\n" for t, lines in tables.items())


def run_with(tmp_path: Path, settings: dict[str, Any], *argv: str) -> int:
    """`gpujitter run` with a config file of `settings` over paths that work here."""
    base = {"log.path": str(tmp_path / "attr.jsonl"), "socket.path": str(tmp_path / "gj.sock")}
    path = tmp_path / "gpujitter.toml"
    path.write_text(toml_of({**base, **settings}))
    return cli.main(["run", "--config", str(path), "--no-nvml", "--quiet", *argv])


@contextlib.contextmanager
def port_in_use() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


MISSING = "/nonexistent-gpujitter/sub"
OTHER_CPUS = str(Path(__file__).parents[1] / "fixtures" / "topology-other-cpus.toml")

# (settings in the file, flags, the key the message names, what else it must say)
BAD: list[tuple[dict[str, Any], tuple[str, ...], str, str]] = [
    ({"socket.queue": 0}, (), "socket.queue", "at least 256"),
    ({"socket.queue": 255}, (), "socket.queue", "at least 256"),
    ({"socket.queue": 1.5}, (), "socket.queue", "whole number"),
    ({"socket.queue": 10**9}, (), "socket.queue", "at most"),
    ({"log.keep": -1}, (), "log.keep", "at least 0"),
    ({"record.keep": 2.5}, (), "record.keep", "whole number"),
    ({"log.max_bytes": -5}, (), "log.max_bytes", "at least 0"),
    ({"probes.thresholds": {"sched.offcpu": -5}}, (), "probes.thresholds", "from 0"),
    ({"probes.thresholds": {"irq.window": "0ms"}}, (), "probes.thresholds", "above 0"),
    ({"probes.thresholds": {"sched.offcpu": "100000000h"}}, (), "probes.thresholds", "1h"),
    ({"probes.thresholds": {"irq.window": "2h"}}, (), "probes.thresholds", "1h"),
    ({"probes.thresholds": {"sched.offcpu": 1.5}}, (), "probes.thresholds", "whole number"),
    ({"probes.thresholds": {"schedd.offcpu": "1ms"}}, (), "probes.thresholds", "'schedd'"),
    ({"probes.thresholds": {"sched.off": "1ms"}}, (), "probes.thresholds", "'off'"),
    ({"probes.enable": ["foo"]}, (), "probes.enable", "unknown probe 'foo'"),
    ({"probes.disable": ["+sched"]}, (), "probes.disable", "unknown probe"),
    ({"watch.pids": [-1]}, (), "watch.pids", "from 1 to"),
    ({"watch.pids": [0]}, (), "watch.pids", "from 1 to"),
    ({"watch.pids": [99999999999]}, (), "watch.pids", "from 1 to"),
    # An empty pattern was taken, and watched no process (`comm ` in the start line).
    ({"watch.comms": ["python*", ""]}, (), "watch.comms", "an empty pattern"),
    ({"watch.cgroups": [MISSING]}, (), "watch.cgroups", "not a cgroup directory"),
    ({"watch.cgroups": ["/tmp"]}, (), "watch.cgroups", "not a cgroup directory"),
    ({"log.path": MISSING + "/attr.jsonl"}, (), "log.path", "does not exist"),
    ({"log.path": "/tmp"}, (), "log.path", "is a directory"),
    ({"record.path": MISSING + "/traces"}, (), "record.path", "does not exist"),
    ({"socket.path": MISSING + "/gj.sock"}, (), "socket.path", "does not exist"),
    ({"socket.path": "/etc/passwd"}, (), "socket.path", "not a socket"),
    ({"socket.group": "no-such-group-gj"}, (), "socket.group", "no such group"),
    ({"topology.override": MISSING + ".toml"}, (), "topology.override", "No such file"),
    ({"metrics.listen": "127.0.0.1:99999"}, (), "metrics.listen", "1 to 65535"),
    ({"metrics.listen": "127.0.0.1:0"}, (), "metrics.listen", "1 to 65535"),
    ({"metrics.listen": "127.0.0.1"}, (), "metrics.listen", "HOST:PORT"),
    ({"metrics.listen": "::1:9464"}, (), "metrics.listen", "[::1]:9464"),
    ({"metrics.listen": "127.0.0.1:http"}, (), "metrics.listen", "HOST:PORT"),
    ({}, ("--metrics", "127.0.0.1:99999"), "metrics.listen", "flag --metrics"),
    ({}, ("--probes", "foo"), "probes.enable", "flag --probes"),
    ({}, ("--disable", "foo"), "probes.disable", "flag --disable"),
    ({}, ("-p", "-1"), "watch.pids", "flag --pid"),
    ({}, ("-c", ""), "watch.comms", "flag --comm"),
    ({}, ("-t", "irq.window=0ns"), "probes.thresholds", "flag --threshold"),
    ({}, ("-t", "sched.offcpu"), "probes.thresholds", "PROBE.KEY"),
    ({}, ("--cgroup", MISSING), "watch.cgroups", "flag --cgroup"),
    ({}, ("--record", MISSING + "/traces"), "record.path", "flag --record"),
    ({}, ("--socket", MISSING + "/gj.sock"), "socket.path", "flag --socket"),
    ({}, ("--log", MISSING + "/a.jsonl"), "log.path", "flag --log"),
    ({}, ("--topology-override", "/etc/passwd"), "topology.override", "flag --topology"),
    ({"topology.override": OTHER_CPUS}, (), "topology.override", "in no [nodes] entry"),
]


# The unit makes these directories when it starts the daemon; --print-config shows the
# values without them.
CHECKED_AT_START = {"log.path", "record.path", "socket.path"}


def assert_one_line(err: str, *said: str) -> None:
    assert err.startswith("gpujitter run: error: ") and err.count("\n") == 1, err
    for text in said:
        assert text in err, err


@pytest.mark.parametrize(("settings", "flags", "key", "said"), BAD)
@pytest.mark.parametrize("print_config", [False, True], ids=["start", "print-config"])
def test_bad_setting_is_one_line_before_probes_attach(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    settings: dict[str, Any],
    flags: tuple[str, ...],
    key: str,
    said: str,
    print_config: bool,
) -> None:
    argv = (*flags, "--print-config") if print_config else flags
    if print_config and key in CHECKED_AT_START:
        assert run_with(tmp_path, settings, *argv) == 0
        return
    assert run_with(tmp_path, settings, *argv) == 2
    err = capsys.readouterr().err
    assert_one_line(err, f" {key}: ", said)
    if settings:
        assert str(tmp_path / "gpujitter.toml") in err


def test_a_log_or_record_path_that_cannot_be_written_is_refused_before_probes_attach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A link or a FIFO at the log's name, a read-only folder: found only at the first write,
    # after ten BPF programs were loaded (or, for a link, written through as root).
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "elsewhere")
    os.mkfifo(tmp_path / "fifo.jsonl")
    for name, said in [("link.jsonl", "is a symbolic link"), ("fifo.jsonl", "not a regular")]:
        assert run_with(tmp_path, {"log.path": str(tmp_path / name)}) == 2
        assert_one_line(capsys.readouterr().err, " log.path: ", said)
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    if os.geteuid() == 0:  # root writes past permissions: a read-only file system, then
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", frozen], check=True)
    else:
        frozen.chmod(0o555)
    try:
        for key, value in [("log.path", frozen / "a.jsonl"), ("record.path", frozen)]:
            assert run_with(tmp_path, {key: str(value)}) == 2
            assert_one_line(capsys.readouterr().err, f" {key}: ", f"cannot write in {frozen}")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", frozen], check=True)


def test_a_socket_or_log_another_daemon_uses_is_refused_before_probes_attach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `gpujitter run` by hand beside the service took the service's socket over (and wrote
    # into its log).
    path = tmp_path / "served.sock"
    server = StreamServer(path, hello=dict, snapshot=list).start()
    try:
        assert run_with(tmp_path, {"socket.path": str(path)}) == 2
        assert_one_line(capsys.readouterr().err, " socket.path: ", "already serving it")
        assert path.is_socket()
    finally:
        server.close()
    with JsonLog(tmp_path / "taken.jsonl"):
        assert run_with(tmp_path, {"log.path": str(tmp_path / "taken.jsonl")}) == 2
        assert_one_line(capsys.readouterr().err, " log.path: ", "another gpujitter daemon")


def test_a_bad_setting_starts_no_compile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `run` starts its probes' compile ahead of the daemon (daemon/service/head_start.py):
    # only once the settings passed, so a mistake is one line at once, seconds of CPU saved.
    assert run_with(tmp_path, {}, "--log", MISSING + "/a.jsonl") == 2
    assert_one_line(capsys.readouterr().err, "log.path")
    assert "gpujitter-compile" not in {t.name for t in threading.enumerate()}


def test_run_gives_its_caller_the_scheduling_it_had(tmp_path: Path) -> None:
    # `run` starts its compile SCHED_BATCH, as the daemon's start runs; a process that
    # called it (this test session) keeps its own policy, as its later children do.
    before = os.sched_getscheduler(0)
    with pytest.raises(Attached):  # where the compile would start
        run_with(tmp_path, {})
    assert os.sched_getscheduler(0) == before


def test_bad_environment_names_its_variable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUJITTER_SOCKET_QUEUE", "0")
    assert run_with(tmp_path, {}) == 2
    assert_one_line(capsys.readouterr().err, "environment GPUJITTER_SOCKET_QUEUE: socket.queue")


def test_metrics_port_in_use_is_one_line_before_probes_attach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with port_in_use() as port:
        assert run_with(tmp_path, {"metrics.listen": f"127.0.0.1:{port}"}) == 2
    assert_one_line(capsys.readouterr().err, "metrics.listen: ", "Address already in use")


def good_settings(tmp_path: Path, port: int) -> dict[str, Any]:
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "cgroup.procs").touch()
    return {
        "socket.queue": 256,
        "log.keep": 0,
        "probes.enable": ["+faults"],
        "probes.thresholds": {"sched.offcpu": "1h", "irq.stolen": 1},
        "watch.pids": [1],
        "watch.cgroups": [str(cgroup)],
        "record.path": str(tmp_path / "traces"),  # made at start: its parent exists
        "metrics.listen": f"[::1]:{port}",
    }


def free_port(family: socket.AddressFamily, host: str) -> int:
    with socket.socket(family) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def test_good_settings_are_accepted_and_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port(socket.AF_INET6, "::1")
    good = good_settings(tmp_path, port)
    assert run_with(tmp_path, good, "--print-config", "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["metrics.listen"]["value"] == f"[::1]:{port}"
    assert shown["probes.thresholds"]["value"] == [
        ["irq.stolen", 1],
        ["sched.offcpu", 3_600_000_000_000],
    ]
    with pytest.raises(Attached):  # every check passed: the daemon went on to start
        run_with(tmp_path, good)
    with pytest.raises(Attached):
        run_with(tmp_path, {"metrics.listen": f":{free_port(socket.AF_INET, '127.0.0.1')}"})


# Other commands take the same options; each is refused before its probes are started.
OTHERS = [
    (("probe", "sched", "-p", "-1"), "--pid"),
    (("probe", "sched", "-t", "sched.offcpu=2h"), "--threshold"),
    (("probe", "sched", "-t", "sched.nope=1ms"), "'nope'"),
    (("probe", "sched", "--cgroup", MISSING), "not a cgroup directory"),
    (("probe", "sched", "-c", ""), "flag --comm: watch.comms: an empty pattern"),
    (("gaps", "--no-nvml", "-c", "python*", "-c", ""), "flag --comm: watch.comms"),
    (("record", "-o", "{tmp}/x.gjtrace", "--comm", ""), "flag --comm: watch.comms"),
    (("top", "--embedded", "-c", ""), "flag --comm: watch.comms"),
    (("probe", "sched", "--topology-override", MISSING), "No such file"),
    (("record", "-o", MISSING + "/x.gjtrace"), "does not exist"),
    (("record", "-o", MISSING + "/traces", "--rotate-size", "1M"), "does not exist"),
    (("record", "-o", "{tmp}/x.gjtrace", "-p", "99999999999"), "--pid"),
    (("gaps", "--no-nvml", "-p", "0"), "--pid"),
    (("top", "--embedded", "-p", "-1"), "--pid"),
    # Checked as --pid is (they ran, "watching pid -5", exit 0).
    (("probe", "malloc", "--precise", "-5"), "--precise"),
    (("record", "-o", "{tmp}/x.gjtrace", "--precise", "0"), "--precise"),
    # A FIFO's open waited for a writer for ever, deaf to ^C.
    (("gaps", "--no-nvml", "--libcuda", "{tmp}/fifo"), "not a regular file"),
    (("gaps", "--no-nvml", "--libcuda", "{tmp}"), "not a regular file"),
    # Another file named by mistake ran "degraded" for ever, waiting for calls.
    (("gaps", "--no-nvml", "--libcuda", "/etc/passwd"), "not a 64-bit little-endian ELF"),
    (("gaps", "--no-nvml", "--libcuda", "/bin/sh"), "exports no cuLaunchKernel; not a libcuda"),
    # NaN passed `<= 0` (a traceback from the feeding loop); 0 s ran the 60 s default.
    (("drill", "clean", "--stall-ms", "nan"), "--stall-ms"),
    (("drill", "clean", "--duration", "0s"), "--duration"),
    # An internal error (OverflowError, exit 70) once the probes were attached.
    (("drill", "clean", "--duration", "9999h"), "want a time above 0, at most 24h"),
    (("drill", "clean", "--duration", "99999999999999999999999h"), "at most 24h"),
]


@pytest.mark.parametrize(("argv", "said"), OTHERS)
def test_other_commands_check_the_same_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], said: str
) -> None:
    os.mkfifo(tmp_path / "fifo")
    assert cli.main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpujitter {argv[0]}: error: ") and err.count("\n") == 1, err
    assert said in err, err
