"""bench/daemon_cpu.py's profiles by thread: a thread whose profiler the interpreter refuses
still runs, and py-spy's raw samples (lines as py-spy 0.4 writes them with --threads) are
summed by the thread's role."""

from __future__ import annotations

import cProfile
import threading
from pathlib import Path
from typing import Any

import pytest

from bench.daemon_cpu import profiled, summarise_py_spy

# Lines of a `py-spy record -f raw -t` of the daemon run by bench.daemon_cpu (the dev VM).
PROBES = "thread (12187): gpujitter-probes"
CALLBACK = "ringbuf_cb_ (bcc/table.py:1273);on_record (probes/base.py:311)"
RAW = [
    "thread (12183): MainThread 14",
    "thread (12183): MainThread;<genexpr> (dataclasses.py:1238) 1",
    f"{PROBES};parse_parts (pathlib.py:91) 1",
    f"{PROBES};{CALLBACK};decode (probes/python_stacks.py:319) 1",
    f"{PROBES};{CALLBACK};decode (probes/python_stacks.py:325) 2",
    f"{PROBES};ringbuf_cb_ (bcc/table.py:1273);on_record (probes/base.py:309) 3",
    "",
]


def test_a_thread_refused_a_profiler_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Python 3.12+ gives cProfile one slot per process: a second thread's enable() raises
    # ValueError, which killed the daemon's probe thread under `--profile` on the H200.
    def refused(self: Any) -> None:
        raise ValueError("Another profiling tool is already active")

    monkeypatch.setattr(cProfile.Profile, "enable", refused)
    ran = []
    worker = threading.Thread(
        target=profiled, args=("probes", lambda: ran.append(1), str(tmp_path))
    )
    worker.start()
    worker.join()
    assert ran == [1]
    assert list(tmp_path.iterdir()) == []
    assert "thread probes not profiled: Another profiling tool" in capsys.readouterr().err


def test_a_profiled_thread_writes_its_own_profile(tmp_path: Path) -> None:
    profiled("probes", lambda: sum(range(1000)), str(tmp_path))
    assert (tmp_path / "probes.prof").stat().st_size > 2  # not an empty marshal ("{0")


def test_py_spy_samples_are_summed_by_role() -> None:
    summary = summarise_py_spy(RAW)
    assert list(summary) == ["main", "probes"]  # most samples first
    probes = summary["probes"]
    assert probes["samples"] == 7
    assert dict(probes["self"]) == {
        "on_record (probes/base.py)": 3,
        "decode (probes/python_stacks.py)": 3,  # two lines, one function
        "parse_parts (pathlib.py)": 1,
    }
    assert dict(probes["total"])["ringbuf_cb_ (bcc/table.py)"] == 6
    assert summary["main"] == {
        "samples": 15,
        "self": [("<genexpr> (dataclasses.py)", 1)],
        "total": [("<genexpr> (dataclasses.py)", 1)],
    }
