"""`gpujitter run` started where cron, containers and careless shells start it: a low open-file
limit, a current folder that was deleted, no writable temporary folder, warnings as errors.
Each either works or ends in one line and exit 2; before, they crashed libbcc (SIGSEGV), ended
in "internal error" (exit 70, which the unit restarts on), or left a probe unavailable."""

from __future__ import annotations

import contextlib
import os
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpujitter.daemon.checks.audit import slow_fault_notes
from gpujitter.probes.base import open_files_needed
from gpujitter.probes.host import HostPaths, status_fields
from gpujitter.probes.registry import TRACEFS
from gpujitter.probes.topology import load_topology
from tests.kernel.conftest import cgroup_hierarchy

GPUJITTER = Path(sys.executable).with_name("gpujitter")
RUN = ["run", "--no-nvml", "--duration", "2s", "--log", "", "--socket", ""]


def gpujitter(
    *argv: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    before: Callable[[], None] | None = None,
    wrap: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*wrap, str(GPUJITTER), *argv], cwd=cwd, env={**os.environ, **(env or {})},
        preexec_fn=before, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def attached(err: str) -> set[str]:
    line = next(x for x in err.splitlines() if x.startswith("# probes attached: "))
    return set(line.removeprefix("# probes attached: ").split(";")[0].split(", "))


def attached_daemon(duration: str, *argv: str) -> tuple[subprocess.Popen[str], list[str]]:
    """`run` with the sched probe alone, no log and no socket, once it said its probes are
    attached: the process, and that line (killed where it says anything else first)."""
    daemon = subprocess.Popen(
        [str(GPUJITTER), "run", "--no-nvml", "--duration", duration, "--log", "", "--socket",
         "", "--probes", "sched", *argv],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert daemon.stderr is not None
    said = [daemon.stderr.readline()]
    if not said[0].startswith("# probes attached: "):
        daemon.kill()
        daemon.wait()
        raise AssertionError(said)
    return daemon, said


def test_the_probes_attached_at_start_stay_available_with_warnings_as_errors() -> None:
    # bcc takes names as bytes; the str ones warned, and under PYTHONWARNINGS=error the
    # faults and swap probes were unavailable and `run` ended in an internal error. (cuda and
    # the Python probes attach their uprobes once a target appears: their stub-libcuda
    # tests in test_cuda reach those calls.)
    done = gpujitter(*RUN, env={"PYTHONWARNINGS": "error"})
    assert done.returncode == 0, done.stderr
    assert "unavailable" not in done.stderr
    assert {"sched", "cstate", "irq", "faults", "swap", "malloc"} <= attached(done.stderr)


def test_the_start_says_what_makes_this_nodes_faults_slow() -> None:
    """On a VM whose host takes its free memory back (this one, 12-06), first touches took
    150-650 us at random and gaps read as host work with nothing said of why: the daemon now
    says the audit's warnings of that kind once, after the probes attach; none on a node
    without them."""
    done = gpujitter(*RUN, "--probes", "sched")
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("# probes attached: "))
    expected = [f"# {n}" for n in slow_fault_notes(HostPaths(), load_topology(nvml=False))]
    assert [x for x in lines if x.startswith("# memory.")] == expected
    assert lines[start + 1 : start + 1 + len(expected)] == expected


def test_an_open_file_limit_the_probes_cannot_live_with_is_one_line() -> None:
    # libbcc crashed (SIGSEGV, no word) at 16 and 24, an internal error at 32 and 40.
    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))

    done = gpujitter(*RUN, before=low)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "open-file limit 32 (ulimit -n" in done.stderr

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]

    def soft_only() -> None:  # the ceiling allows: the daemon raises its own soft limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, hard))

    assert gpujitter(*RUN, "--probes", "sched", before=soft_only).returncode == 0


def test_descriptors_a_start_was_passed_count_against_its_open_file_limit() -> None:
    # A start under a limit the probes fit in, passed 150 descriptors by what started it (a
    # supervisor that leaks its own), crashed libbcc (SIGSEGV, no word); at 70, an internal
    # error. A few, which the probes' figure has room for, change nothing.
    need = open_files_needed()

    def at_need() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, need))

    def passed(count: int) -> subprocess.CompletedProcess[str]:
        fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
        try:
            return subprocess.run(
                [str(GPUJITTER), *RUN], pass_fds=fds,
                preexec_fn=at_need, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
        finally:
            for fd in fds:
                os.close(fd)

    done = passed(150)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"open-file limit {need} (ulimit -n, LimitNOFILE=) is below the " in done.stderr
    assert "descriptors open already" in done.stderr
    done = passed(8)
    assert done.returncode == 0, done.stderr


def test_a_daemon_out_of_descriptors_at_its_first_tick_says_which_limit() -> None:
    # Its limit lowered under it (prlimit) before its first tick: a tick's open failed, the
    # probe thread died, and the stop's wake-up of its closed set read `standard output: Bad
    # file descriptor` in its place. Now one line naming the limit, exit 2, probes detached.
    daemon, said = attached_daemon("10s")
    try:
        assert daemon.stderr is not None
        hard = resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE)[1]
        resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (16, hard))  # below what it holds
        said += daemon.stderr.read().splitlines()
        assert daemon.wait(timeout=60) == 2, said
    finally:
        daemon.kill()
        daemon.wait()
    assert said[-1].startswith(
        "gpujitter run: error: out of file descriptors (Too many open files"
    ), said
    assert "none is left under its open-file limit of 16 (ulimit -n, LimitNOFILE=)" in said[-1]
    assert not [line for line in said if "Traceback" in line or "Bad file" in line], said


def test_a_deleted_current_folder_is_named(tmp_path: Path) -> None:
    # bcc's loader asks for it: "Failed to compile BPF module <text>", and doctor --load
    # told root to use sudo.
    gone = tmp_path / "gone"
    gone.mkdir()
    done = gpujitter(*RUN, "--probes", "sched", cwd=gone, before=lambda: gone.rmdir())
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "the current folder was deleted" in done.stderr


def test_no_writable_temporary_folder_is_no_error() -> None:
    # The compile's messages went through a temporary file: with /tmp and /var/tmp read-only
    # (ProtectSystem= without PrivateTmp=) every start was an internal error.
    script = (
        "for d in /tmp /var/tmp; do mount --bind $d $d && mount -o remount,bind,ro $d; done; "
        "cd /tmp; "  # tempfile's last resort is the current folder
        f'exec "$0" {shlex.join(RUN)} --probes sched'
    )
    done = gpujitter(wrap=("unshare", "-m", "--propagation", "private", "sh", "-c", script))
    assert done.returncode == 0, done.stderr
    assert "sched" in attached(done.stderr)


def sighup_ignored(pid: int) -> bool:
    """Whether the process ignores SIGHUP now (SigIgn of /proc/PID/status, bit 0)."""
    return bool(int(status_fields(HostPaths(), pid).get("SigIgn", "0"), 16) & 1)


def test_a_hangup_while_starting_does_not_kill_the_daemon() -> None:
    # SIGHUP is the daemon's reload; in its first ~0.3 s (its modules still importing, no
    # handler yet) the default action killed it.
    proc = subprocess.Popen(
        [str(GPUJITTER), *RUN, "--probes", "sched"], stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    # As soon as the CLI ignores it: before that the interpreter itself is starting (~50 ms,
    # longer beside a CPU hog, where a fixed 50 ms once came too early), a window no Python
    # can close.
    deadline = time.monotonic() + 10
    while not sighup_ignored(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None, "SIGHUP never ignored"
        time.sleep(0.002)
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err


def handles(pid: int, signum: int) -> bool:
    """Whether the process has a handler of its own for `signum` now (SigCgt)."""
    return bool(int(status_fields(HostPaths(), pid).get("SigCgt", "0"), 16) >> (signum - 1) & 1)


def compiling(pid: int) -> bool:
    """Whether the process's probes compile now (the capture of clang's messages is open)."""
    with contextlib.suppress(OSError):
        return any("memfd:gpujitter-compile" in os.readlink(f"/proc/{pid}/fd/{fd}")
                   for fd in os.listdir(f"/proc/{pid}/fd"))  # fmt: skip
    return False


@pytest.mark.parametrize(
    ("signum", "in_compile"),
    [(signal.SIGTERM, False), (signal.SIGTERM, True), (signal.SIGINT, True)],
)
def test_a_stop_while_starting_is_one_line_and_exit_130(
    tmp_path: Path, signum: int, in_compile: bool
) -> None:
    # SIGTERM while the daemon imported and its probes compiled (its first ~3 s) ended it by
    # the default action: status 143, not a word, where operations.md promises 130. It is
    # taken as soon as the CLI runs, with one line, the socket and log never made.
    log, path = tmp_path / "a.jsonl", tmp_path / "s.sock"
    proc = subprocess.Popen(
        [str(GPUJITTER), "run", "--no-nvml", "--log", str(log), "--socket", str(path),
         "--pid", str(os.getpid())],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (handles(proc.pid, signal.SIGTERM) and (compiling(proc.pid) or not in_compile)):
            assert time.monotonic() < deadline and proc.poll() is None, "never in that state"
            time.sleep(0.002)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # (a daemon left running by a failed test holds its probes)
        proc.wait()
    assert proc.returncode == 130, err
    assert err.splitlines()[-1] == (
        f"# stopped by {signal.Signals(signum).name} while starting, before the probes were "
        "attached: nothing was analysed or written"
    ), err
    assert not log.exists() and not path.exists()
    for events in ("uprobe_events", "kprobe_events"):  # bcc names its events by its pid
        with contextlib.suppress(FileNotFoundError):
            assert f"_bcc_{proc.pid}" not in (TRACEFS / events).read_text()


def test_a_watched_pid_that_exits_is_said_and_stray_signals_do_not_end_the_daemon() -> None:
    # A --pid process that exits leaves the daemon watching nothing (a process given its id
    # later is another one: tests/unit/test_procfs.py); said once. SIGUSR2 and SIGALRM, by
    # their default, ended it on the spot with nothing flushed.
    job = subprocess.Popen(["sleep", "60"])
    try:
        daemon, said = attached_daemon("5s", "--pid", str(job.pid))
        try:
            assert daemon.stderr is not None
            job.kill()
            job.wait()
            for signum in (signal.SIGUSR2, signal.SIGALRM, signal.SIGUSR2):
                daemon.send_signal(signum)
            said += daemon.stderr.read().splitlines()
            assert daemon.wait(timeout=60) == 0, said
        finally:
            daemon.kill()
    finally:
        job.kill()
    exited = f"# watch: pid {job.pid} exited; a process given its id later is not watched"
    assert said.count(exited) == 1, said
    strays = [line.split(" ")[1] for line in said if " ignored: " in line]
    assert strays == ["SIGUSR2", "SIGALRM"], said
    assert said[-1].startswith("# stopped: "), said


@contextlib.contextmanager
def sleeping_job(by: str) -> Iterator[tuple[list[str], str]]:
    """A `sleep` to watch by --pid, or by --cgroup (a cgroup of its own, made for it): the
    flags that watch it, and what the watch reads to find it."""
    if by == "pid":
        job = subprocess.Popen(["sleep", "60"])
        try:
            yield ["--pid", str(job.pid)], "/proc"
        finally:
            job.kill()
            job.wait()
        return
    group = cgroup_hierarchy() / f"gpujitter-test-{os.getpid()}"
    group.mkdir()
    try:
        job = subprocess.Popen(
            ["sleep", "60"],
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
        try:
            yield ["--cgroup", str(group)], str(group)
        finally:
            job.kill()
            job.wait()
    finally:
        deadline = time.monotonic() + 5
        while (group / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        group.rmdir()


@pytest.mark.parametrize("by", ["pid", "cgroup"])
def test_a_daemon_out_of_descriptors_keeps_watching_its_job_and_says_so(
    by: str, tmp_path: Path
) -> None:
    # At its RLIMIT_NOFILE (stream clients took the rest) the daemon could not open
    # /proc/PID/stat, said the --pid it watched had exited while it ran, and stopped watching
    # it; a --cgroup's directory that it could not list read as a cgroup without processes,
    # and its processes left the watched set with nothing said. It keeps them now, says once
    # what cannot be read, and once that it can again.
    path = tmp_path / "s.sock"
    clients: list[socket.socket] = []
    with sleeping_job(by) as (flags, where):
        daemon = subprocess.Popen(
            [str(GPUJITTER), "run", "--no-nvml", "--duration", "8s", "--log", "", "--socket",
             str(path), "--probes", "sched", *flags],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert daemon.stderr is not None
            said = [daemon.stderr.readline()]
            assert said[0].startswith("# probes attached: "), said
            time.sleep(1.5)  # past the first tick, which opens what the probes read each tick
            highest = max(int(fd) for fd in os.listdir(f"/proc/{daemon.pid}/fd"))
            hard = resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE)[1]
            resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (highest + 8, hard))
            first = b""
            while not first.startswith(b'{"type":"error"'):  # until it is out of descriptors
                clients.append(socket.socket(socket.AF_UNIX))
                clients[-1].settimeout(5)
                clients[-1].connect(str(path))
                first = clients[-1].recv(200)
            time.sleep(2.5)  # two refreshes at least
            for client in clients:
                client.close()
            said += daemon.stderr.read().splitlines()
            assert daemon.wait(timeout=60) == 0, said
        finally:
            daemon.kill()
            for client in clients:
                client.close()
    assert not [line for line in said if "exited" in line], said
    cannot = [line for line in said if line.startswith(f"# watch: cannot read {where} (")]
    assert len(cannot) == 1 and "Too many open files" in cannot[0], said
    again = f"# watch: {where} read again: the watched set follows it again"
    assert said.count(again) == 1, said


def test_a_watched_pid_with_no_process_or_a_kernel_threads_is_said_at_start() -> None:
    # A mistyped or stale --pid watches nothing; the run says so rather than log nothing.
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that was a process a moment ago, none now
    done = gpujitter(*RUN, "--probes", "malloc", "--pid", str(gone.pid), "--pid", str(os.getpid()))
    assert done.returncode == 0, done.stderr
    assert f"# watch: pid {gone.pid}: no such process" in done.stderr.splitlines()
    assert f"pid {os.getpid()}: no such process" not in done.stderr
    # pid 2, kthreadd: no GPU work, no gap is ever its (it was watched in silence)
    done = gpujitter(*RUN, "--probes", "malloc", "--pid", "2", "--pid", str(os.getpid()))
    assert done.returncode == 0, done.stderr
    assert ("# watch: pid 2: a kernel thread (kthreadd), not a GPU process: nothing can be "
            "attributed to it") in done.stderr.splitlines()  # fmt: skip
    assert f"pid {os.getpid()}: a kernel thread" not in done.stderr
    # `probe` and `gaps` say it too, with --json as without (stdout is their data, stderr
    # the warning).
    for command in (["probe", "malloc", "--duration", "1s"], ["gaps", "--no-nvml", "--duration",
                    "1s", "--min-gap", "5ms"]):  # fmt: skip
        for json_out in ([], ["--json"]):
            done = gpujitter(*command, *json_out, "--pid", str(gone.pid), "--pid", "2")
            assert done.returncode == 0, done.stderr
            said = done.stderr.splitlines()
            assert f"# watch: pid {gone.pid}: no such process" in said, (command, json_out, said)
            kthreadd = "# watch: pid 2: a kernel thread (kthreadd)"
            assert any(line.startswith(kthreadd) for line in said), (command, json_out, said)
