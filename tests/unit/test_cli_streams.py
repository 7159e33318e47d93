"""The CLI when its own streams misbehave, as a shell leaves them: output whose reader left
(`| head`), a full device, a closed descriptor (`>&-`, `2>&-`), an encoding that cannot hold
our text. Each is one line on standard error and an exit status that says what happened,
never a traceback or Python's "Exception ignored" at the interpreter's exit. Run with the
output buffered, as a user's shell runs it: a short text output then reaches the stream
only when flushed, which is where these failures surface."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "h200-training.gjtrace"


def gpujitter(*args: str, env: dict[str, str] | None = None, **how: Any) -> Any:
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-m", "gpujitter", *args],
                          env={**environ, **(env or {})}, timeout=60, **how)  # fmt: skip


def clean(stderr: bytes) -> str:
    text = stderr.decode()
    assert "Traceback" not in text and "Exception ignored" not in text, text
    return text.strip()


def test_a_reader_that_leaves_is_no_error() -> None:
    for args in (["topo"], ["topo", "--json"], ["--help"], ["report", str(EXAMPLE)]):
        read, write = os.pipe()
        os.close(read)  # the reader gone before the first byte (`| head -c 0`)
        proc = gpujitter(*args, stdout=write, stderr=subprocess.PIPE)
        os.close(write)
        assert proc.returncode == 0, args
        assert clean(proc.stderr) == "", args


def test_a_full_device_is_one_line_for_text_and_help() -> None:
    with open("/dev/full", "w") as full:
        for args in (["topo"], ["topo", "--help"]):  # the help's said "gpujitter: error:"
            proc = gpujitter(*args, stdout=full, stderr=subprocess.PIPE)
            assert proc.returncode == 2, args
            said = clean(proc.stderr)
            assert said == "gpujitter topo: error: standard output: No space left on device"


def test_closed_output_is_an_error_not_a_silent_success() -> None:
    for args in (["topo"], ["topo", "--json"]):
        proc = gpujitter(*args, stdout=None, stderr=subprocess.PIPE,
                         preexec_fn=lambda: os.close(1))  # fmt: skip
        assert proc.returncode == 2, args
        assert clean(proc.stderr) == "gpujitter topo: error: standard output: closed"


def test_closed_error_stream_keeps_the_status_and_the_output_clean() -> None:
    proc = gpujitter("topo", "--bogus", stdout=subprocess.PIPE, preexec_fn=lambda: os.close(2))
    assert proc.returncode == 2
    assert proc.stdout == b""


def test_closed_standard_descriptors_are_taken_by_dev_null_not_by_our_files(
    tmp_path: Path,
) -> None:
    """Started with 0, 1 and 2 closed (a careless init script), the first files a command
    opens would take those numbers, and a C library's write to standard error (bcc's
    warnings) would land in a trace or a log. Each is /dev/null before the command runs."""
    seen = tmp_path / "fds.json"
    child = f"""if True:
        import os, orjson
        from gpujitter.cli import main
        for fd in (0, 1, 2):
            os.close(fd)
        code = main(["report", {str(EXAMPLE)!r}, "--html", {str(tmp_path / "r.html")!r}])
        links = [os.readlink(f"/proc/self/fd/{{fd}}") for fd in (0, 1, 2)]
        with open({str(seen)!r}, "wb") as f:
            f.write(orjson.dumps({{"code": code, "links": links}}))
    """
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.run([sys.executable, "-c", child], env=environ, timeout=60,
                          capture_output=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    got = orjson.loads(seen.read_bytes())
    assert got["links"] == [os.devnull] * 3, got
    assert (tmp_path / "r.html").read_bytes().startswith(b"<!DOCTYPE html>")


def test_an_ascii_output_gets_our_symbols_escaped() -> None:
    proc = gpujitter("report", str(EXAMPLE), env={"PYTHONIOENCODING": "ascii"},
                     capture_output=True)  # fmt: skip
    assert proc.returncode == 0
    assert clean(proc.stderr) == ""
    assert b"\\xb1" in proc.stdout  # the resolution's plus-minus, escaped


def test_report_html_never_replaces_a_recording_it_reads(tmp_path: Path) -> None:
    trace = tmp_path / "run.gjtrace"
    shutil.copy(EXAMPLE, trace)
    before = trace.read_bytes()
    proc = gpujitter("report", str(trace), "--html", str(trace), capture_output=True)
    assert proc.returncode == 2
    assert "is a recording being read" in clean(proc.stderr)
    assert trace.read_bytes() == before


def test_report_html_never_replaces_a_rotated_file_of_a_log_it_reads(tmp_path: Path) -> None:
    # One log named is read with its rotated files: each of those is being read too.
    made = gpujitter("report", str(EXAMPLE), "--json", capture_output=True)
    lines = [orjson.dumps({"schema": "gpujitter.attribution/1", **a})
             for a in orjson.loads(made.stdout)["attributions"]]  # fmt: skip
    log, older = tmp_path / "a.jsonl", tmp_path / "a.jsonl.1"
    older.write_bytes(b"\n".join(lines[:16]) + b"\n")
    log.write_bytes(b"\n".join(lines[16:]) + b"\n")
    before = older.read_bytes()
    proc = gpujitter("report", str(log), "--html", str(older), capture_output=True)
    assert proc.returncode == 2
    assert "is a recording being read" in clean(proc.stderr)
    assert older.read_bytes() == before


def test_an_output_past_the_size_limit_is_named(tmp_path: Path) -> None:
    out = tmp_path / "timeline.json"

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, resource.RLIM_INFINITY))

    proc = gpujitter("export", str(EXAMPLE), "-o", str(out), capture_output=True,
                     preexec_fn=small_files)  # fmt: skip
    assert proc.returncode == 2
    assert clean(proc.stderr) == f"gpujitter export: error: {out}: File too large"
    assert not out.exists()  # no half a timeline left behind


def test_export_to_standard_output_keeps_its_summary_apart(tmp_path: Path) -> None:
    # `gpujitter export run.gjtrace -o - | zstd`: the timeline alone on standard output, what
    # tells of it on standard error, and no file named "-" anywhere
    proc = gpujitter("export", str(EXAMPLE), "-o", "-", "--json", capture_output=True,
                     cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert orjson.loads(proc.stdout)["traceEvents"]
    summary = orjson.loads(proc.stderr)
    assert summary["output"] == "-" and summary["gaps"] > 0
    text = gpujitter("export", str(EXAMPLE), "-o", "-", capture_output=True, cwd=tmp_path)
    assert text.stdout == proc.stdout
    assert clean(text.stderr).startswith(f"standard output: {summary['gaps']} gaps")
    assert list(tmp_path.iterdir()) == []
    named = gpujitter("export", str(EXAMPLE), "-o", "./-", capture_output=True, cwd=tmp_path)
    assert named.returncode == 0 and (tmp_path / "-").read_bytes() == proc.stdout
    with open("/dev/full", "w") as full:
        proc = gpujitter("export", str(EXAMPLE), "-o", "-", stdout=full, stderr=subprocess.PIPE)
    assert proc.returncode == 2
    assert clean(proc.stderr) == "gpujitter export: error: standard output: No space left on device"


def test_report_html_to_standard_output_keeps_the_report_apart(tmp_path: Path) -> None:
    # `gpujitter report run.gjtrace --html - | ssh web 'cat > gaps.html'`: the page alone
    page = gpujitter("report", str(EXAMPLE), "--html", "-", capture_output=True, cwd=tmp_path)
    assert page.returncode == 0, page.stderr
    assert page.stdout.startswith(b"<!DOCTYPE html>") and page.stdout.rstrip().endswith(b"</html>")
    plain = gpujitter("report", str(EXAMPLE), capture_output=True)
    assert clean(page.stderr) == plain.stdout.decode().strip()
    as_json = gpujitter("report", str(EXAMPLE), "--html", "-", "--json", capture_output=True,
                        cwd=tmp_path)  # fmt: skip
    assert as_json.stdout == page.stdout
    assert orjson.loads(as_json.stderr)["attributions"]
    assert list(tmp_path.iterdir()) == []
    # the page is UTF-8 whatever the output's encoding (its ± too); ./- is a file of that name
    ascii_out = gpujitter("report", str(EXAMPLE), "--html", "-", capture_output=True,
                          env={"PYTHONIOENCODING": "ascii"})  # fmt: skip
    assert ascii_out.stdout == page.stdout and "±".encode() in page.stdout
    named = gpujitter("report", str(EXAMPLE), "--html", "./-", capture_output=True, cwd=tmp_path)
    assert named.returncode == 0 and (tmp_path / "-").read_bytes() == page.stdout


def test_report_html_keeps_the_permissions_of_the_page_it_replaces(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    # a page written before the generator tag: known by its head and title
    page.write_text(
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>GPU idle gaps on n</title>"
    )
    page.chmod(0o640)
    proc = gpujitter("report", str(EXAMPLE), "--html", str(page), capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert page.read_text().startswith("<!DOCTYPE html>")
    assert oct(page.stat().st_mode & 0o777) == oct(0o640)


def test_sigterm_midway_leaves_no_half_timeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `timeout 60 gpujitter export ...` on a long recording: killed while it writes
    from gpujitter.cli import main
    from gpujitter.daemon.offline import timeline

    def killed_midway(traces: object, out: Any, *rest: object) -> None:
        out.write(b'{"traceEvents": [')
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises in here
        raise AssertionError("SIGTERM did not stop the export")

    monkeypatch.setattr(timeline, "export", killed_midway)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "timeline.json"
    assert main(["export", str(EXAMPLE), "-o", str(out)]) == 143
    assert not out.exists()
    assert signal.getsignal(signal.SIGTERM) is before  # the command's handler is gone again
