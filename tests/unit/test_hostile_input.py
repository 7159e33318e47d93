"""Input that no command's own checks foresaw, found by fuzzing the offline commands: each is
one line on stderr and exit 2 (or, for what is valid, a normal answer), never a traceback or
a hang. The process's last resort for the rest is one line and exit 70 (cli.entry)."""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpujitter import cli
from gpujitter.cli.gpus import nvml_backend
from gpujitter.cli.output import print_json
from gpujitter.daemon.checks.audit.model import read_process_file
from gpujitter.probes.host import parse_cpulist
from tests.unit.forked import as_nobody, in_child

EXAMPLE = Path(__file__).parents[2] / "examples" / "h200-training.gjtrace"
NVML_IDLE = Path(__file__).parents[1] / "fixtures" / "nvml" / "h200-idle.jsonl"


def gpujitter(*args: str | bytes, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpujitter", *args],
        capture_output=True,
        text=True,
        errors="backslashreplace",
        timeout=60,
        cwd=cwd,
    )


def refused(proc: subprocess.CompletedProcess[str], said: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert said in proc.stderr


def nvml_recording(tmp_path: Path, *, header: bytes | None = None, extra: bytes = b"") -> Path:
    lines = NVML_IDLE.read_bytes().splitlines(keepends=True)
    path = tmp_path / "nvml.jsonl"
    path.write_bytes((lines[0] if header is None else header) + b"".join(lines[1:3]) + extra)
    return path


@pytest.mark.parametrize(
    ("header", "extra", "said"),
    [
        (b"", b"", "not an NVML recording"),
        (b"[]\n", b"", "not an NVML recording"),
        # a later format is refused, not read as this one (its answers taken as they come)
        (
            b'{"format": "gpujitter-nvml-recording", "version": 99}\n',
            b"",
            "an NVML recording of version 99; this gpujitter reads 1",
        ),
        (None, b"{}\n", "line 4: not an NVML call record"),
        (
            None,
            b'{"fn": "nvmlInit", "gpu": null, "args": 7, "t": 1, "t_end": 2, "ret": null}\n',
            "line 4: not an NVML call record",
        ),
        (None, b"[1, 2]\n", "line 4: not an NVML call record"),
    ],
)
def test_an_nvml_replay_that_is_not_a_recording(
    tmp_path: Path, header: bytes | None, extra: bytes, said: str
) -> None:
    path = nvml_recording(tmp_path, header=header, extra=extra)
    refused(gpujitter("gpus", "--json", "--nvml-replay", str(path)), said)


def test_an_nvml_replay_whose_text_answers_are_no_text_is_read_as_without_them(
    tmp_path: Path,
) -> None:
    """A name, UUID or driver version replayed as a JSON object or a number went into the
    output as it was: `gpus --json` ended in "cannot be written as JSON" (text mode printed
    the object). Such an answer is no answer: "unknown", as when the driver gives none."""
    lines = []
    for line in NVML_IDLE.read_bytes().splitlines(keepends=True):
        rec = orjson.loads(line)
        if rec.get("fn") in ("nvmlDeviceGetName", "nvmlDeviceGetUUID"):
            rec["ret"] = {"a": [1, 2]}
        elif rec.get("fn") == "nvmlSystemGetDriverVersion":
            rec["ret"] = 7
        lines.append(orjson.dumps(rec) + b"\n")
    path = tmp_path / "nvml.jsonl"
    path.write_bytes(b"".join(lines))
    proc = gpujitter("gpus", "--json", "--nvml-replay", str(path))
    assert proc.returncode == 0, proc.stderr
    out = orjson.loads(proc.stdout)
    assert [(g["name"], g["uuid"]) for g in out["gpus"]] == [("unknown", "")] * len(out["gpus"])
    assert out["gpus"] and out["driver"] is None


def test_an_nvml_record_path_that_cannot_be_written_is_said_before_the_work(
    tmp_path: Path,
) -> None:
    refused(
        gpujitter("gpus", "--json", "--nvml-record", str(tmp_path / "gone" / "x.jsonl")),
        "no folder",
    )
    refused(gpujitter("gpus", "--json", "--nvml-record", str(tmp_path)), "is a directory")
    # A file already there (a trace named by mistake) is never written over.
    kept = tmp_path / "run.gjtrace"
    shutil.copy(EXAMPLE, kept)
    refused(gpujitter("gpus", "--json", "--nvml-record", str(kept)), "exists; remove it")
    assert kept.read_bytes() == EXAMPLE.read_bytes()
    # A folder this user may not search: one line, not an internal error (os.stat's).
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    args = argparse.Namespace(nvml_replay=None, nvml_record=str(private / "x.jsonl"))
    said = in_child(lambda: nvml_backend(args), as_nobody)
    assert said == f"escaped: GpujitterError: --nvml-record {private}/x.jsonl: Permission denied"


def test_a_file_name_that_is_not_utf8_reads_as_escaped_json(tmp_path: Path) -> None:
    name = os.fsencode(tmp_path) + b"/\xff\xfe.gjtrace"
    shutil.copy(EXAMPLE, name)
    for command in ("trace", "report"):
        proc = gpujitter(command, "--json", name)
        assert proc.returncode == 0, proc.stderr
        json.loads(proc.stdout)
        assert "\\\\xff\\\\xfe.gjtrace" in proc.stdout


def test_a_file_name_that_is_not_utf8_reads_as_its_bytes_in_messages(tmp_path: Path) -> None:
    """operations.md promises `\\xff` for such a byte; os.fsdecode's stand-in for it was
    shown `\\udcff`, in a command's summary and in an error's quoted value."""
    out = os.fsencode(tmp_path) + b"/o\xff.json"
    proc = gpujitter("export", str(EXAMPLE), "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{tmp_path}/o\\xff.json: 32 gaps"), proc.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "gpujitter", "run", "--print-config"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "GPUJITTER_METRICS_LISTEN": os.fsdecode(b"\xff")},
    )  # fmt: skip
    refused(bad, "(got '\\xff')")


@pytest.mark.parametrize("line", [1, 2])
def test_a_record_type_that_is_not_a_string(tmp_path: Path, line: int) -> None:
    events = tmp_path / "events.ndjson"
    good = orjson.dumps({"type": "meta.clock", "ts_ns": 1, "realtime_ns": 1})
    bad = b'{"type": {"a": 1}, "ts_ns": 1}'
    events.write_bytes(b"\n".join([bad] if line == 1 else [good, bad]) + b"\n")
    proc = gpujitter("trace", str(events))
    # alone, it tells no file's kind; after a record that does, a kind that is no name is
    # damage, as in a log (a kind this version does not know is a newer writer's, noted)
    assert proc.returncode == (2 if line == 1 else 1), proc.stderr
    assert "Traceback" not in proc.stderr
    assert line == 1 or "1 damaged line(s) skipped, the first: line 2" in proc.stdout
    log = tmp_path / "attributions.jsonl"
    log.write_bytes(
        b'{"schema": "gpujitter.attribution/1", "type": "gpu.attribution"}\n' * (line - 1)
        + b'{"schema": "gpujitter.attribution/1", "type": ["gpu.attribution"]}\n'
    )
    # damage, skipped and said: `trace` exits 1 for it, `report` reads on
    for command, status in (("trace", 1), ("report", 0)):
        proc = gpujitter(command, str(log))
        assert proc.returncode == status and "Traceback" not in proc.stderr, proc.stderr
        assert "damaged line(s) skipped" in proc.stdout


def test_toml_nested_deeper_than_the_parser_recurses(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    refused(gpujitter("run", "--print-config", "--config", str(deep)), "nested too deeply")
    refused(gpujitter("topo", "--topology-override", str(deep)), "nested too deeply")


@pytest.mark.parametrize(
    "nodes", ['0 = "0-4000000000"', '99999999999999999999 = "0-1"', '0 = "3-1"']
)
def test_a_topology_override_past_any_machine(tmp_path: Path, nodes: str) -> None:
    override = tmp_path / "topology.toml"
    override.write_text(f"[nodes]\n{nodes}\n")
    refused(gpujitter("topo", "--json", "--topology-override", str(override)), "bad [nodes]")


def test_a_size_past_64_bits_is_refused_not_printed(tmp_path: Path) -> None:
    config = tmp_path / "gpujitter.toml"
    config.write_text('[log]\nmax_bytes = "99999999999999999999999999999TiB"\n')
    refused(gpujitter("run", "--print-config", "--json", "--config", str(config)), "log.max_bytes")


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.gjtrace"
    os.mkfifo(fifo)
    for command in ("trace", "report"):
        refused(gpujitter(command, str(fifo)), "not a regular file")


def test_a_full_output_device_is_one_line() -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "gpujitter", "report", str(EXAMPLE)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == "gpujitter report: error: standard output: No space left on device"
    )


def test_what_slips_past_every_check_is_one_line_and_ex_software(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(argv: object = None) -> int:
        raise TypeError("unhashable type: 'dict'")

    monkeypatch.setattr(cli, "main", broken)
    monkeypatch.setattr(sys, "argv", ["gpujitter", "report", "x"])
    monkeypatch.delenv("GPUJITTER_DEBUG", raising=False)
    with pytest.raises(SystemExit) as stop:
        cli.entry()
    assert stop.value.code == 70
    err = capsys.readouterr().err
    assert err.startswith("gpujitter report: internal error: TypeError: unhashable type")
    assert len(err.strip().splitlines()) == 1
    monkeypatch.setenv("GPUJITTER_DEBUG", "1")
    with pytest.raises(TypeError):
        cli.entry()


def test_json_output_takes_undecodable_names_and_huge_integers(
    capsysbinary: pytest.CaptureFixture[bytes],
) -> None:
    print_json({"path": os.fsdecode(b"/tmp/\xff"), "n": 10**30, "ok": [1, "a"]})
    out = json.loads(capsysbinary.readouterr().out)
    assert out == {"path": "/tmp/\\xff", "n": str(10**30), "ok": [1, "a"]}


def test_cpu_lists_past_any_kernel_are_malformed() -> None:
    assert parse_cpulist("0-3,8") == [0, 1, 2, 3, 8]
    for text in ("0-4000000000", "65536", "5-3", "-1"):
        with pytest.raises(ValueError):
            parse_cpulist(text)


def test_a_report_window_that_ends_before_it_starts() -> None:
    refused(
        gpujitter("report", str(EXAMPLE), "--from", "+20s", "--to", "+10s"), "is not after --from"
    )


def test_traces_of_two_nodes_or_one_segment_twice_are_not_one_stream(tmp_path: Path) -> None:
    """Read as one stream (report, export), another node's events would land on this one's
    CPUs, GPUs and clock, and a segment read twice would count its gaps twice."""
    from gpujitter.daemon.sinks.trace import TraceWriter
    from tests.unit.trace_samples import every_kind, header

    def write(name: str, **changes: object) -> Path:
        with TraceWriter(tmp_path / name, header(**changes)) as w:
            w.write(every_kind()[0])
        return tmp_path / name

    a = write("a.gjtrace", session="s1", segment=0)
    other = write("b.gjtrace", session="s2", kernel="6.1.0-other")
    again = tmp_path / "c.gjtrace"
    shutil.copy(a, again)
    refused(gpujitter("report", str(a), str(other)), "traces of 2 nodes")
    refused(gpujitter("report", str(a), str(again)), "same recording's segment 0")
    assert gpujitter("trace", str(a), str(again)).returncode == 0  # each file on its own


def test_an_html_page_shows_a_hostile_host_name_inert(tmp_path: Path) -> None:
    from gpujitter.daemon.sinks.trace import TraceWriter
    from tests.fixtures.streams.synthetic import TWO_NODES, Stream
    from tests.unit.trace_samples import header

    s = Stream().offcpu(100, 125, runnable=100, state="preempted", other=555, other_comm="x")
    with TraceWriter(
        tmp_path / "a.gjtrace", header(host="evil\x1b]0;pwned\x07", topology=TWO_NODES)
    ) as w:
        for ev in s.ran(0, 1000).gap(100, 140).in_emission_order():
            w.write(ev)
    page = tmp_path / "a.html"
    proc = gpujitter("report", str(tmp_path / "a.gjtrace"), "--html", str(page))
    assert proc.returncode == 0, proc.stderr
    html = page.read_bytes()
    assert b"\x1b" not in html and b"\x07" not in html
    assert b"evil\\x1b]0;pwned\\x07" in html


def test_an_empty_path_is_refused_not_read_as_this_directory() -> None:
    refused(gpujitter("trace", ""), "an empty path was given")
    refused(gpujitter("report", ""), "an empty path was given")
    refused(gpujitter("report", "x.gjtrace", "--html", ""), "--html: an empty file name")


def test_an_html_page_replaces_a_file_whole_and_writes_through_a_link(tmp_path: Path) -> None:
    page = tmp_path / "page.html"
    assert gpujitter("report", str(EXAMPLE), "--html", str(page)).returncode == 0
    old = page.read_text() + "<!-- the old page -->"  # the report run before
    page.write_text(old)
    assert gpujitter("report", str(EXAMPLE), "--html", str(page)).returncode == 0
    assert page.read_text().startswith("<!DOCTYPE html>") and page.read_text() != old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]  # no temporary left
    # a link is written through, never replaced by a file of its own
    link = tmp_path / "link.html"
    link.symlink_to(page)
    page.write_text(old)
    assert gpujitter("report", str(EXAMPLE), "--html", str(link)).returncode == 0
    assert link.is_symlink() and page.read_text().startswith("<!DOCTYPE html>")
    # where it cannot be written, the page there stays as it was
    page.write_text(old)
    (tmp_path / ".page.html.tmp").mkdir()  # the temporary's name taken: the write fails
    refused(gpujitter("report", str(EXAMPLE), "--html", str(page)), "--html")
    assert page.read_text() == old


def test_an_html_page_never_replaces_what_is_no_page_of_its_own(tmp_path: Path) -> None:
    """Any file named was replaced, another recording or a document named by mistake, and
    through a link too; it is refused before the work now, and left as it was."""
    recording = tmp_path / "other.gjtrace"
    shutil.copy(EXAMPLE, recording)
    notes = tmp_path / "notes.html"
    notes.write_text("<!DOCTYPE html><p>the team's runbook</p>")
    link = tmp_path / "link.html"
    link.symlink_to(recording)
    for target in (recording, notes, link):
        refused(
            gpujitter("report", str(EXAMPLE), "--html", str(target)),
            f"--html {target} exists and is no gpujitter report page",
        )
    assert recording.read_bytes() == EXAMPLE.read_bytes()
    assert notes.read_text() == "<!DOCTYPE html><p>the team's runbook</p>"
    refused(gpujitter("report", str(EXAMPLE), "--html", str(tmp_path)), "is a directory")
    long = tmp_path / ("x" * 300)  # said before the work, not an internal error after it
    refused(gpujitter("report", str(EXAMPLE), "--html", str(long)), "File name too long")


def test_json_nested_past_what_the_writer_takes_is_one_line() -> None:
    from gpujitter.errors import GpujitterError

    deep: Any = []
    for _ in range(300):  # a daemon's snapshot read back with orjson takes up to 1024 levels
        deep = [deep]
    with pytest.raises(GpujitterError, match="cannot be written as JSON"):
        print_json({"snapshot": deep})


def test_a_wall_clock_no_date_holds_is_shown_relative() -> None:
    from datetime import UTC

    from gpujitter.tui.text import WallClock

    clock = WallClock(ts_ns=0, realtime_ns=10**22, tz=UTC)  # year ~318857
    assert clock.time(1_500_000_000) == "+1.500s"
    assert clock.date(1_500_000_000) == ""
    assert WallClock(ts_ns=0, realtime_ns=-(10**22), tz=UTC).time(0, digits=0) == "+0s"
    assert WallClock(ts_ns=0, realtime_ns=10**18, tz=UTC).date(0) == "2001-09-09"


# -- the second fuzzing round (2026-12-04) -------------------------------------------------------


def test_nvml_and_profiler_inputs_that_are_no_regular_file_or_too_big(tmp_path: Path) -> None:
    # A FIFO waited for ever; /dev/zero took the memory there was; a gzip bomb decompressed.
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    bomb = tmp_path / "bomb.json.gz"
    with gzip.open(bomb, "wb", compresslevel=1) as f:
        chunk = b" " * (1 << 20)
        for _ in range(1100):  # 1.1 GiB of blanks, ~1 MiB compressed
            f.write(chunk)
    for path, said in ((fifo, "not a regular file"), (Path("/dev/zero"), "not a regular file")):
        refused(gpujitter("gpus", "--nvml-replay", str(path)), said)
    out = tmp_path / "t.json"
    for path, said in (
        (fifo, "not a regular file"),
        (Path("/dev/zero"), "not a regular file"),
        (bomb, "decompresses to more than 1 GiB"),
    ):
        refused(gpujitter("export", str(EXAMPLE), "-o", str(out), "--merge", str(path)), said)
        assert not out.exists()


@pytest.mark.parametrize(
    ("drop", "change", "said"),
    [
        ("nvmlInit", None, "it was not recorded by `gpujitter gpus --nvml-record`"),
        (None, ("nvmlDeviceGetCpuAffinity", b'"ret":[null]'), "not an NVML session's answers"),
        (None, ("nvmlDeviceGetPciInfo", b'"ret":{"busId":7}'), "not an NVML session's answers"),
    ],
)
def test_an_nvml_recording_whose_answers_are_not_nvmls(
    tmp_path: Path, drop: str | None, change: tuple[str, bytes] | None, said: str
) -> None:
    lines = NVML_IDLE.read_bytes().splitlines(keepends=True)
    out = [lines[0]]
    for line in lines[1:]:
        call = orjson.loads(line)
        if call["fn"] == drop:
            continue
        if change and call["fn"] == change[0]:
            line = orjson.dumps({k: v for k, v in call.items() if k != "ret"})[:-1]
            line += b"," + change[1] + b"}\n"
        out.append(line)
    path = tmp_path / "nvml.jsonl"
    path.write_bytes(b"".join(out))
    refused(gpujitter("gpus", "--nvml-replay", str(path)), said)


def test_a_node_distance_or_node_directory_that_does_not_read_as_numbers(tmp_path: Path) -> None:
    from gpujitter.probes.host import HostPaths
    from gpujitter.probes.topology import read_node_distance

    root = tmp_path / "root"
    for node, distance in (("node0", "10 x\n"), ("node1", "21 10\n"), ("node1x", "10\n")):
        (root / "sys/devices/system/node" / node).mkdir(parents=True)
        (root / "sys/devices/system/node" / node / "distance").write_text(distance)
    assert read_node_distance(HostPaths.under(root)) == {1: (21, 10)}


def test_one_log_named_twice_is_read_once(tmp_path: Path) -> None:
    # Under a second name (a link, dir/../file) its gaps were counted twice, exit 0.
    from gpujitter.daemon.sinks.jsonlog import JsonLog
    from gpujitter.daemon.sinks.trace import trace_paths

    log = tmp_path / "a.jsonl"
    with JsonLog(log) as w:
        w.write({"type": "x"})
    (tmp_path / "link.jsonl").symlink_to(log)
    (tmp_path / "d").mkdir()
    names = [log, tmp_path / "link.jsonl", tmp_path / "d" / ".." / "a.jsonl"]
    assert trace_paths(names) == [log]


def test_nvml_options_that_would_do_nothing_are_refused(tmp_path: Path) -> None:
    # --nvml-record beside a playback (or beside saved events) recorded nothing, silently.
    target = str(tmp_path / "x.jsonl")
    refused(gpujitter("gpus", "--nvml-replay", str(NVML_IDLE), "--nvml-record", target),
            "--nvml-record with --nvml-replay")  # fmt: skip
    events = tmp_path / "events.ndjson"
    events.write_bytes(orjson.dumps({"type": "meta.clock", "ts_ns": 1, "wall_ns": 1}) + b"\n")
    refused(gpujitter("gaps", "--replay-events", str(events), "--nvml-record", target),
            "reads saved events: --nvml-record would do nothing with it")  # fmt: skip
    assert not Path(target).exists()
    # every live-only option alike: --save-events beside a replay wrote no file, 0 exit
    saved = str(tmp_path / "g.ndjson")
    refused(gpujitter("gaps", "--replay-events", str(events), "--save-events", saved,
                      "--duration", "5x", "--pid", "1"),
            "--duration, --save-events, --pid would do nothing with it")  # fmt: skip
    assert not Path(saved).exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--min-gap", "0"), "--min-gap: gaps.min_gap: expected a time above 0 and at most 10s"),
        (("--min-gap", "20s"), "gaps.min_gap: expected a time above 0 and at most 10s"),
        (("--quiet-stretch", "2h"), "cuda.quiet = '2h': expected a time from 0 and at most 1h"),
        (("--sync-block", ""), "--sync-block: probes.thresholds: expected"),  # not 1 ms
        (("--libcuda", "/nonexistent/libcuda.so"), "--libcuda /nonexistent/libcuda.so: no such"),
        (
            ("--save-events", "/nonexistent/x.ndjson"),
            "--save-events /nonexistent/x.ndjson: no fold",
        ),
    ],
)
def test_gaps_values_are_checked_before_the_probes_start(args: tuple[str, ...], said: str) -> None:
    """Accepted where run refuses them, or found wrong only after the probes were built (a
    save file's folder: an internal error then)."""
    refused(gpujitter("gaps", "--duration", "1s", "--no-nvml", *args), said)


def test_gaps_save_events_never_writes_over_a_file(tmp_path: Path) -> None:
    kept = tmp_path / "kept.ndjson"
    kept.write_text("the user's")
    refused(gpujitter("gaps", "--duration", "1s", "--no-nvml", "--save-events", str(kept)),
            "exists; remove it or choose another name")  # fmt: skip
    assert kept.read_text() == "the user's"


def test_an_executable_link_that_loops_is_no_crash(tmp_path: Path) -> None:
    # A deleted executable reads "<path> (deleted)", which its owner can make a link to
    # itself: Path.resolve raised RuntimeError, and malloc's precise mode stopped the start.
    from gpujitter.probes.host import HostPaths
    from gpujitter.probes.malloc_sites import allocator_sites

    task = tmp_path / "proc" / "42"
    task.mkdir(parents=True)
    (task / "maps").write_text("")
    (task / "exe").symlink_to(task / "exe")
    assert allocator_sites(42, HostPaths.under(tmp_path)) == []


def test_a_sched_ext_thread_and_a_damaged_kernel_config_are_read(tmp_path: Path) -> None:
    import gzip as gz

    from gpujitter.daemon.checks.doctor.hooks import kernel_config
    from gpujitter.daemon.service.own_scheduling import thread_policies
    from gpujitter.probes.host import HostPaths

    # policy 7 (sched_ext, 6.12 on) was past the names: the thread was dropped unnamed
    fields = ["0"] * 50
    fields[16], fields[38] = "10", "7"  # nice, policy
    task = tmp_path / "proc" / "42" / "task" / "43"
    task.mkdir(parents=True)
    (task / "stat").write_text("43 (a) (b) S " + " ".join(fields[1:]) + "\n")
    assert thread_policies(tmp_path / "proc", 42) == {43: ("ext", 10)}
    # a damaged /proc/config.gz (a recorded tree) ended doctor with zlib.error
    config = tmp_path / "proc" / "config.gz"
    config.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage")
    assert kernel_config(HostPaths.under(tmp_path)) == {}
    config.write_bytes(gz.compress('CONFIG_LOCALVERSION="caf\xe9"\n'.encode("latin-1")))
    assert kernel_config(HostPaths.under(tmp_path)) == {"CONFIG_LOCALVERSION": '"caf\ufffd"'}


def test_gaps_save_events_on_a_full_disk_names_the_file(tmp_path: Path) -> None:
    """A full disk under --save-events read 'standard output: No space left on device'."""
    from gpujitter.cli.gaps import SavedEvents
    from gpujitter.errors import GpujitterError
    from gpujitter.probes.events import ClockRef

    saved = SavedEvents(tmp_path / "e.ndjson", ClockRef(ts_ns=1, realtime_ns=2))
    saved.path = Path("/dev/full")  # made as a new file, then its writes refused
    saved.file = open("/dev/full", "wb", buffering=0)  # noqa: SIM115
    with pytest.raises(GpujitterError, match="--save-events /dev/full: No space left"):
        saved.event(ClockRef(ts_ns=3, realtime_ns=4))
    saved.file.close()


def test_a_recorded_host_tree_with_a_fifo_or_an_endless_file_is_read_not_waited_on(
    tmp_path: Path,
) -> None:
    """`--root` reads a copy of a node's /proc and /sys: a FIFO there (its open waited for a
    writer for ever) reads as empty, and a link to /dev/zero as unreadable, past any procfs
    or sysfs file's size; topo and audit answer, the audit's process files FIFOs too."""
    tree = tmp_path / "h200-vm"
    shutil.copytree(
        Path(__file__).parents[1] / "fixtures" / "hosts" / "h200-vm", tree, symlinks=True
    )
    actions = tree / "sys/kernel/irq/24/actions"
    actions.unlink()
    os.mkfifo(actions)
    cpus = tree / "sys/devices/pci0000:00/0000:00:06.0/local_cpulist"
    cpus.unlink()
    cpus.symlink_to("/dev/zero")
    for name in ("environ", "numa_maps", "maps", "stat"):  # the audit's reads of a process
        (tree / "proc/523" / name).unlink(missing_ok=True)
        os.mkfifo(tree / "proc/523" / name)
    for command in ("topo", "audit"):
        proc = gpujitter(command, "--root", str(tree), "--json")
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode in (0, 1), proc.stderr
        assert json.loads(proc.stdout)
    # what the audit reads of a GPU process NVML lists (none here without NVML)
    assert read_process_file(tree / "proc/523/environ") == ""
    with pytest.raises(OSError, match="longer than any procfs or sysfs file"):
        read_process_file(cpus)
