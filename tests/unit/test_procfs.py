"""The per-process /proc readers on real text (tests/fixtures/procfs, captured from a python3
that loaded a library copied under a folder name with spaces, mapped a file it then deleted,
and named a thread "a) (b"): maps read once for every probe that scans them, a task's stat
cut at the last parenthesis."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpujitter.probes.cuda import mapped_libcuda
from gpujitter.probes.host import HostPaths, status_fields
from gpujitter.probes.malloc_sites import file_mappings
from gpujitter.probes.procfs import (
    Swap,
    in_root,
    mapped_files,
    parse_maps,
    parse_swaps,
    read_mapped_files,
    read_maps,
    task_ids,
    task_stat_fields,
    task_state,
    thread_count,
)
from gpujitter.probes.python_gc import interpreter_files
from gpujitter.probes.watch import (
    WHY_CGROUP,
    WHY_COMM,
    WHY_FORK,
    WHY_PID,
    WatchSpec,
    cgroup_members,
    resolve,
    unreadable,
    unreadable_where,
)
from gpujitter.probes.workload import WorkloadReader
from tests.unit.test_stream_robustness import no_descriptor_left

TREE = HostPaths.under(Path(__file__).parents[1] / "fixtures" / "procfs")
PID = 4242
LIBCUDA = "/tmp/gj maps jr5vchee/libcuda.so.1"


def test_every_line_is_read_with_its_fields() -> None:
    maps = read_maps(TREE, PID)
    text = (TREE.proc / str(PID) / "maps").read_text()
    assert len(maps) == len(text.splitlines())
    first = maps[0]
    assert (first.start, first.end, first.perms, first.offset, first.path) == (
        0x400000, 0x41F000, "r--p", 0, "/usr/bin/python3.11"
    )  # fmt: skip
    assert [m.start for m in maps] == sorted(m.start for m in maps)
    assert any(m.path == "" for m in maps)  # anonymous memory
    assert any(m.path == "[stack]" for m in maps)


def test_a_path_with_spaces_is_kept_whole_and_a_deleted_file_is_not_a_file() -> None:
    maps = read_maps(TREE, PID)
    cuda = [m for m in maps if m.path == LIBCUDA]
    assert [m.perms for m in cuda] == ["r--p", "r-xp", "r--p", "r--p", "rw-p"]
    deleted = [m for m in maps if m.path.endswith("scratch.bin (deleted)")]
    assert len(deleted) == 1 and not deleted[0].file
    assert all(m.file for m in cuda)


def test_mapped_files_once_each_in_address_order() -> None:
    files = mapped_files(TREE, PID)
    assert files[0] == "/usr/bin/python3.11"
    assert len(files) == len(set(files))
    assert LIBCUDA in files and not any("(deleted)" in f for f in files)
    code = mapped_files(TREE, PID, executable=True)
    assert set(code) < set(files) and LIBCUDA in code


def test_a_scan_for_one_name_finds_what_the_whole_list_holds_of_it() -> None:
    for name, executable in (("libcuda.so", False), ("python", True), ("lib", True)):
        files = mapped_files(TREE, PID, executable=executable)
        wanted = [f for f in files if name in f]
        assert wanted and mapped_files(TREE, PID, executable=executable, containing=name) == wanted


def test_offsets_become_addresses_in_the_mapping_that_holds_them() -> None:
    text = next(m for m in read_maps(TREE, PID) if m.path == LIBCUDA and m.executable)
    assert text.holds(0x3000) and text.holds(0x15FFF) and not text.holds(0x16000)
    assert text.address_of(0x3010) == 0x7F5B8238A010


def test_probes_find_their_files_through_the_one_reader() -> None:
    root = str(TREE.proc / str(PID) / "root")
    assert mapped_libcuda(PID, TREE) == [root + LIBCUDA]
    assert interpreter_files(PID, TREE) == [("/usr/bin/python3.11", root + "/usr/bin/python3.11")]
    by_file = file_mappings(TREE, PID)
    assert all(m.executable for ms in by_file.values() for m in ms)
    assert [m.offset for m in by_file["/usr/lib/x86_64-linux-gnu/libc.so.6"]] == [0x26000]
    assert in_root(TREE, PID, "[vdso]") == "[vdso]"


def test_a_process_that_cannot_be_read() -> None:
    with pytest.raises(OSError):
        read_maps(TREE, 1)
    assert mapped_files(TREE, 1) == []
    with pytest.raises(OSError):  # for the audit, which must not take it for "maps nothing"
        read_mapped_files(TREE, 1)
    assert mapped_libcuda(1, TREE) == []


def test_malformed_lines_are_skipped() -> None:
    maps = parse_maps("garbage\n7f00-7f01 r-xp zz fe:00 1 /x\n7f00-7f10 r-xp 0 fe:00 1 /lib/a b\n")
    assert [(m.path, m.size) for m in maps] == [("/lib/a b", 0x10)]


def test_a_task_stat_is_cut_at_the_last_parenthesis() -> None:
    raw = (TREE.proc / str(PID) / "task" / "4243" / "stat").read_bytes()
    assert task_state(raw) == "S"
    fields = task_stat_fields(raw)
    assert fields[0] == "S" and fields[16] == "0"  # state, nice
    assert int(fields[38]) == 0  # policy: normal
    assert task_state(b"") == ""


def test_this_thread_reads_as_running() -> None:
    path = f"/proc/{os.getpid()}/task/{threading.get_native_id()}/stat"
    assert task_state(Path(path).read_bytes()) == "R"


def test_status_of_a_process_whose_name_is_not_utf8_is_read(tmp_path: Path) -> None:
    """A name with an invalid byte (prctl takes any) made the whole status file unreadable:
    no Tgid, so a forked child so named was not taken for a process."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOSTILE_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == b"named\n"
        fields = status_fields(HostPaths(), child.pid)
        assert fields["Tgid"] == str(child.pid)
        assert fields["Name"].startswith("gj") and "\ufffd" in fields["Name"]
    finally:
        child.kill()
        child.wait()


def test_a_mapped_file_whose_name_is_not_utf8_is_read_and_opens(tmp_path: Path) -> None:
    """A process mapping such a file made every reader of its maps raise UnicodeDecodeError
    (`audit --pid` ended in an internal error; the daemon's libcuda scan reads the same
    file each second)."""
    import mmap

    odd = os.fsencode(tmp_path) + b"/lib\xff\xfe.so"
    with open(odd, "wb") as f:
        f.write(b"x" * 4096)
    with open(odd, "rb") as f, mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ):
        files = mapped_files(HostPaths(), "self", containing="lib\udcff")
        assert len(files) == 1 and os.fsencode(files[0]) == odd
        assert Path(files[0]).read_bytes()[:1] == b"x"  # the name opens the file it names
        assert any(m.path == files[0] for m in read_maps(HostPaths(), "self"))


HOSTILE_CHILD = """
import ctypes, sys
ctypes.CDLL(None).prctl(15, b"gj\\xff\\xfe", 0, 0, 0)  # PR_SET_NAME
print("named", flush=True)
sys.stdin.read()
"""


def test_a_watched_pid_names_its_process_not_the_next_one_given_its_id(tmp_path: Path) -> None:
    """--pid P watches the process P named when first resolved; once it is gone, or only a
    zombie, a process that the kernel gives P again is another one (its start differs)."""
    paths = HostPaths.under(tmp_path)

    def process(pid: int, state: str, start: int | None) -> None:
        stat = paths.proc / str(pid) / "stat"
        if start is None:
            stat.unlink(missing_ok=True)
            return
        stat.parent.mkdir(parents=True, exist_ok=True)
        fields = [state] + ["0"] * 18 + [str(start)] + ["0"] * 30
        stat.write_text(f"{pid} (job (x)) {' '.join(fields)}\n")

    spec, pinned = WatchSpec(pids={500, 600}), {}
    process(500, "S", 1000)
    process(600, "Z", 900)  # already exited: never a process to watch
    assert resolve(spec, paths, pinned=pinned) == {500: WHY_PID}
    assert resolve(spec, paths, pinned=pinned) == {500: WHY_PID}
    process(500, "Z", 1000)  # exited, not yet reaped
    assert resolve(spec, paths, pinned=pinned) == {}
    process(500, "R", 4000)  # reaped, and its id given to a new process
    process(600, "R", 4100)
    assert resolve(spec, paths, pinned=pinned) == {}


def test_a_watched_pid_is_not_taken_for_gone_while_proc_cannot_be_read() -> None:
    """At its RLIMIT_NOFILE the daemon could not open /proc/PID/stat and resolved its --pid to
    nothing: it said the process had exited and stopped watching it while it ran. Only the
    process's end reads as gone; a failure that says nothing of it is raised, for the caller
    to keep what it watches."""
    spec, pinned, me = WatchSpec(pids={os.getpid()}), {}, {os.getpid(): WHY_PID}
    assert resolve(spec, HostPaths(), walked=lambda t: True, pinned=pinned) == me
    with no_descriptor_left(), pytest.raises(OSError) as raised:
        resolve(spec, HostPaths(), walked=lambda t: True, pinned=pinned)
    assert raised.value.errno == errno.EMFILE
    assert resolve(spec, HostPaths(), walked=lambda t: True, pinned=pinned) == me
    with no_descriptor_left(), pytest.raises(OSError):
        resolve(WatchSpec(comms=["python*"]), HostPaths())  # /proc not listed: not "none"


def test_a_process_whose_names_cannot_be_read_is_no_answer_to_a_comm_pattern(
    tmp_path: Path,
) -> None:
    """--comm: a process whose comm or cmdline could not be read (out of descriptors, EACCES,
    EIO) read as one with no name, matched nothing and left the watched set while it ran.
    Only its end (its /proc entry gone) is no match now; any other failure is raised, for the
    caller to keep what it watches (here a directory where the file was: EISDIR)."""
    paths = HostPaths.under(tmp_path)
    for pid, comm, cmdline in ((100, b"pt_main_thread", b"/usr/bin/python3\0train.py\0"),
                               (200, b"sleep", b"sleep\x0060\0")):  # fmt: skip
        (tmp_path / f"proc/{pid}").mkdir(parents=True)
        (tmp_path / f"proc/{pid}/comm").write_bytes(comm + b"\n")
        (tmp_path / f"proc/{pid}/cmdline").write_bytes(cmdline)
    spec = WatchSpec(comms=["python*", "pt_*"])
    assert resolve(spec, paths) == {100: WHY_COMM}
    for name in ("comm", "cmdline"):
        (tmp_path / f"proc/100/{name}").rename(tmp_path / "kept")
        (tmp_path / f"proc/100/{name}").mkdir()
        with pytest.raises(OSError) as raised:
            resolve(spec, paths)
        assert raised.value.errno == errno.EISDIR
        (tmp_path / f"proc/100/{name}").rmdir()
        (tmp_path / "kept").rename(tmp_path / f"proc/100/{name}")
    assert resolve(spec, paths) == {100: WHY_COMM}
    for name in ("comm", "cmdline"):
        (tmp_path / f"proc/100/{name}").unlink()  # ended: its entry goes
    assert resolve(spec, paths) == {}


def test_a_cgroup_that_cannot_be_read_is_no_cgroup_without_processes(tmp_path: Path) -> None:
    """--cgroup: a cgroup directory that could not be listed (out of descriptors: os.walk
    passes over it) or whose cgroup.procs could not be read read as one without processes,
    and they left the watched set while they ran. Only the cgroup's removal reads as none now;
    resolve names the watched cgroup, for the daemon to say which it cannot read."""
    job = tmp_path / "job_42"
    (job / "step_0").mkdir(parents=True)
    (job / "cgroup.procs").write_text("")
    (job / "step_0" / "cgroup.procs").write_text("101\n102\n")
    assert sorted(cgroup_members(job)) == [101, 102]
    with no_descriptor_left(), pytest.raises(OSError) as raised:
        cgroup_members(job)
    assert raised.value.errno == errno.EMFILE
    (job / "step_0" / "cgroup.procs").unlink()
    (job / "step_0" / "cgroup.procs").mkdir()
    with pytest.raises(OSError) as raised:
        resolve(WatchSpec(cgroups=[job]), HostPaths.under(tmp_path))
    assert (raised.value.errno, raised.value.filename) == (errno.EISDIR, str(job))
    assert cgroup_members(tmp_path / "gone") == []


def test_a_workload_that_cannot_be_read_is_no_answer_to_a_pod_or_job(tmp_path: Path) -> None:
    """--pod and --slurm-job: a process whose /proc/PID/cgroup could not be read was in no
    pod or job, and left the watched set while it ran; its label was never said either."""
    paths = HostPaths.under(tmp_path)
    (tmp_path / "proc/300").mkdir(parents=True)
    (tmp_path / "proc/300/cgroup").write_text("0::/system.slice/slurmstepd.scope/job_7/step_0\n")
    assert resolve(WatchSpec(slurm_jobs=["7"]), paths) == {300: WHY_CGROUP}
    (tmp_path / "proc/300/cgroup").unlink()
    (tmp_path / "proc/300/cgroup").mkdir()
    with pytest.raises(OSError):
        resolve(WatchSpec(slurm_jobs=["7"]), paths)
    assert WorkloadReader(paths).of(300) is None  # labels elsewhere: none where unread
    (tmp_path / "proc/300/cgroup").rmdir()
    assert WorkloadReader(paths).read(300) is None  # ended


def test_what_the_watch_cannot_read_is_named_back_from_its_reason() -> None:
    for where in ("/proc", "/sys/fs/cgroup/cpu/a (b)/job"):
        assert unreadable_where(unreadable(where, "Too many open files")) == where


def test_a_watched_process_brings_its_children_and_theirs() -> None:
    """resolve() walks task/TID/children of every thread (task_ids), down the tree."""
    grandchild = "import subprocess, sys; subprocess.run(['sleep', '30'])"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])",
        ]
    )
    try:
        for _ in range(200):
            chosen = resolve(WatchSpec(pids={child.pid}), HostPaths())
            if len(chosen) == 3:
                break
            time.sleep(0.01)
        assert chosen[child.pid] == WHY_PID and len(chosen) == 3
        assert all(why == WHY_FORK for pid, why in chosen.items() if pid != child.pid)
        # A process whose children were walked before is left to the fork hook.
        walked = resolve(WatchSpec(pids={child.pid}), HostPaths(), walked=lambda t: True)
        assert walked == {child.pid: WHY_PID}
        assert task_ids(HostPaths(), child.pid) == [child.pid]
        assert threading.get_native_id() in task_ids(HostPaths(), os.getpid())
    finally:
        for pid in chosen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child.wait()
    assert task_ids(HostPaths(), child.pid) == []


def test_a_thread_count_follows_threads_that_start_and_end() -> None:
    """thread_count reads the kernel's count of a process's threads off its task folder's
    link count (python_stacks reads a thread list again only when it moved)."""
    paths = HostPaths()
    before = thread_count(paths, os.getpid())
    assert before == len(task_ids(paths, os.getpid()))
    done = threading.Event()
    threads = [threading.Thread(target=done.wait) for _ in range(3)]
    for th in threads:
        th.start()
    try:
        assert thread_count(paths, os.getpid()) == before + 3
    finally:
        done.set()
        for th in threads:
            th.join()
    # join() returns as a thread's Python part ends; the kernel task goes a moment later
    deadline = time.monotonic() + 5
    while thread_count(paths, os.getpid()) != before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_count(paths, os.getpid()) == before
    assert thread_count(paths, 2**22 + 1) == -1  # above pid_max: no such process


def test_swap_devices_with_escaped_paths_and_odd_rows() -> None:
    """The rows of /proc/swaps (the layout of the kernel's swap_show: a path with a space is
    escaped as \\040); the drill's swap file and the audit read them here."""
    text = (
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        "/dev/vda3                               partition\t2097148\t\t0\t\t-2\n"
        "/var/tmp/gj\\040swap                     file\t\t65532\t\t1024\t\t-3\n"
        "/broken file\n"
    )
    assert parse_swaps(text) == [
        Swap("/dev/vda3", "partition", 2097148, 0, -2),
        Swap("/var/tmp/gj swap", "file", 65532, 1024, -3),
    ]
    assert parse_swaps("Filename\tType\tSize\tUsed\tPriority\n") == []
    assert parse_swaps("") == []


def test_a_name_with_a_line_break_other_than_newline_is_one_mapping() -> None:
    # splitlines() also cut at \f, \x1c-\x1e, U+0085 and U+2028: a libcuda under such a
    # directory read as two broken lines and was never found; the kernel writes a newline
    # in a name as \012.
    lines = [
        "7f0000000000-7f0000001000 r-xp 00000000 08:01 11 /opt/a\x0cb/libcuda.so.1",
        "7f0000001000-7f0000002000 r-xp 00000000 08:01 12 /opt/c\u2028d/libcuda.so.1",
        "7f0000002000-7f0000003000 r-xp 00000000 08:01 13 /opt/e\\012f/libcuda.so.1",
    ]
    assert [m.path for m in parse_maps("\n".join(lines) + "\n")] == [
        "/opt/a\x0cb/libcuda.so.1",
        "/opt/c\u2028d/libcuda.so.1",
        "/opt/e\nf/libcuda.so.1",
    ]


def test_a_cgroup_watched_brings_the_processes_of_the_cgroups_below_it(tmp_path: Path) -> None:
    # On cgroup v2 a job's or a slice's own cgroup holds no process once it has controllers:
    # --cgroup on it watched nothing, and said nothing.
    from gpujitter.probes.watch import cgroup_members

    job = tmp_path / "job_42"
    (job / "step_0" / "task_1").mkdir(parents=True)
    (job / "cgroup.procs").write_text("")
    (job / "step_0" / "cgroup.procs").write_text("101\n102\n")
    (job / "step_0" / "task_1" / "cgroup.procs").write_text("103\n")
    assert sorted(cgroup_members(job)) == [101, 102, 103]
    assert cgroup_members(tmp_path / "gone") == []


def test_a_cgroup_name_with_a_line_break_is_one_path() -> None:
    from gpujitter.probes.workload import cgroup_paths

    text = "0::/user.slice/a\x0c0::/kubepods/podX/" + "f" * 64 + "\n"
    assert cgroup_paths(text) == ["/user.slice/a\x0c0::/kubepods/podX/" + "f" * 64]


def test_pids_that_watch_nothing_are_named_one_line_each() -> None:
    """A pid that names no process, or a kernel thread (pid 2, kthreadd: no GPU work), is
    said by `run`, `probe` and `gaps` at their start; a live user process is not."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    spec = WatchSpec(pids={os.getpid(), 2, gone.pid})
    assert spec.unwatchable(HostPaths()) == sorted(
        [f"watch: pid {gone.pid}: no such process",
         "watch: pid 2: a kernel thread (kthreadd), not a GPU process: nothing can be "
         "attributed to it"],
        key=lambda line: int(line.split()[2].rstrip(":")),
    )  # fmt: skip
