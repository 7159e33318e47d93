"""The soak and fault suite (bench/soak.py) in its short form: the real daemon under slow,
stuck and spamming clients, floods, a disk that fills and frees, SIGHUP, SIGKILL and SIGTERM
for about 100 s; and the log's behaviour on a disk that fills, as a follower of the file
sees it. `make soak` runs the same suite for 30 minutes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest

from bench.soak import Plan, summary
from gpujitter.daemon.sinks import jsonlog
from gpujitter.daemon.sinks.jsonlog import JsonLog
from tests.kernel import soak_beside


def test_short_soak_accounts_for_every_attribution_and_never_hangs(
    request: pytest.FixtureRequest,
) -> None:
    """Plan.short(100 s), run beside the tests that attach no probes (soak_beside.py)."""
    result = soak_beside.running(request.config).result(timeout_s=280)
    assert result["plan"] == asdict(Plan.short(soak_beside.SOAK_S))
    assert result["passed"], summary(result)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "disk"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "soak", where], check=True)
    yield where
    subprocess.run(["umount", where], check=True)


def test_a_log_follower_never_sees_a_line_the_full_disk_cuts_off(
    small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak's log follower read half a line: on a full disk the write stopped midway and
    the log cut the fragment off after the follower had read it."""
    log = small_disk / "attr.jsonl"
    real_write = os.write
    seen_tails: list[bytes] = []

    def write_then_look(fd: int, data: bytes) -> int:
        written = real_write(fd, data)
        with open(log, "rb") as follower:  # what `tail -F` finds right after the write
            follower.seek(-1, os.SEEK_END)
            seen_tails.append(follower.read(1))
        return written

    monkeypatch.setattr(jsonlog.os, "write", write_then_look)
    with JsonLog(log, say=lambda line: None) as sink:
        results = [sink.write({"type": "x", "pad": "p" * 1000}) for _ in range(100)]
    assert False in results  # the disk filled
    assert set(seen_tails) == {b"\n"}
    assert log.read_bytes().endswith(b"\n")
