"""Recorded host trees for the unit tests: tests/fixtures/hosts/<name>/ (proc, sys, etc),
copied into a temporary folder, optionally with overlay trees or single files laid over
them, so each test states the one difference it is about; and wall times in UTC."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpujitter.probes.host import HostPaths
from tests.nvml_playback import PlaybackBackend

HOSTS = Path(__file__).parents[1] / "fixtures" / "hosts"

MakeTree = Callable[..., HostPaths]


@pytest.fixture
def host_tree(tmp_path: Path) -> MakeTree:
    """host_tree("two-node-gpu", "two-node-gpu-bad", files={"proc/sys/vm/swappiness": "0"})
    -> HostPaths of a fresh copy of the named trees, later ones laid over earlier ones,
    then `files` written (None deletes a file)."""

    made: list[Path] = []

    def make(*names: str, files: dict[str, str | None] | None = None) -> HostPaths:
        root = tmp_path / f"tree{len(made)}"
        made.append(root)
        for name in names:
            shutil.copytree(HOSTS / name, root, symlinks=True, dirs_exist_ok=True)
        root.mkdir(exist_ok=True)
        for rel, text in (files or {}).items():
            path = root / rel
            if text is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return HostPaths.under(root)

    return make


@pytest.fixture
def h200_nvml() -> PlaybackBackend:
    """NVML as the H200 machine answered it (driver 580.159, one GPU, a torch process)."""
    return PlaybackBackend.load(HOSTS / "h200-vm" / "nvml.json")


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Wall times in UTC, as the tests that name them write them (the commands and pages
    print local time)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
