"""Each GPU's idle power floor, kept across restarts in the daemon's state directory, so that a
daemon started under a busy GPU can judge power samples at once (daemon/analysis/gaps.py,
docs/gpu.md).

One small JSON file, keyed by board (NVML UUID, else PCI address) with the model each floor
was proven on; replaced atomically. A file that cannot be read or trusted is ignored with one
line: the detector then waits for fresh evidence, as on a first start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from gpujitter.daemon.analysis.gaps import plausible_idle_w
from gpujitter.daemon.sinks.rotation import fsync_dir
from gpujitter.errors import GpujitterError
from gpujitter.files import read_regular
from gpujitter.probes.nvml import GpuInfo

FILE_NAME = "idle-floors.json"
FORMAT = 1
# A few hundred bytes a board; a bigger file is not one of ours.
_MAX_BYTES = 1 << 20


class _Invalid(ValueError):
    pass


def board_key(gpu: GpuInfo) -> str:
    return gpu.uuid or f"pci:{gpu.pci_bus_id}"


class IdleFloorStore:
    """The floors of `gpus` (this node's GPUs, as NVML names them) in file `path`."""

    def __init__(self, path: Path, gpus: Sequence[GpuInfo]) -> None:
        self.path = path
        self.gpus = list(gpus)
        self._boards: dict[str, dict[str, Any]] = {}  # as last read or written
        self._saved: dict[int, float] = {}

    def load(self) -> tuple[dict[int, float], str]:
        """GPU index -> idle floor (W) for the GPUs whose board has a trusted entry, and one
        line saying what was ignored ('' when nothing was; no file is a first start)."""
        if not os.path.lexists(self.path):
            return {}, ""
        try:
            # only a regular file: a FIFO put there would hold the daemon's start for ever
            # (its open waits for a writer), a device such as /dev/zero never ends
            data = read_regular(self.path, "ignoring", _MAX_BYTES, "not an idle-floor file")
            self._boards = _parse(orjson.loads(data))
        except GpujitterError as err:
            return {}, str(err)
        except (orjson.JSONDecodeError, _Invalid) as err:
            return {}, f"ignoring {self.path}: not an idle-floor file of this version ({err})"
        floors: dict[int, float] = {}
        refused = []
        for gpu in self.gpus:
            entry = self._boards.get(board_key(gpu))
            if entry is None:
                continue
            if entry["model"] != gpu.name:
                refused.append(f"GPU {gpu.index}'s floor was proven on a {entry['model']}, "
                               f"it is a {gpu.name} now")  # fmt: skip
                continue
            floors[gpu.index] = entry["idle_w"]
        self._saved = dict(floors)
        return floors, (f"ignoring part of {self.path}: " + "; ".join(refused)) if refused else ""

    def save(self, floors: Mapping[int, float]) -> None:
        """Keep `floors` (GPU index -> W), with what the file held for other boards; nothing
        is written when they did not change. Raises OSError."""
        if dict(floors) == self._saved:
            return
        for gpu in self.gpus:
            if gpu.index in floors:
                self._boards[board_key(gpu)] = {
                    "model": gpu.name,
                    "pci_bus_id": gpu.pci_bus_id,
                    "idle_w": floors[gpu.index],
                }
        data = orjson.dumps({"format": FORMAT, "boards": self._boards})
        tmp = self.path.with_name(self.path.name + ".tmp")
        # O_NONBLOCK: a FIFO there fails the open (no reader) rather than holding the main loop
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | os.O_CLOEXEC
        with open(os.open(tmp, flags, 0o666), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)
        self._saved = dict(floors)


def _parse(doc: Any) -> dict[str, dict[str, Any]]:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise _Invalid(f"format is not {FORMAT}")
    boards = doc.get("boards")
    if not isinstance(boards, dict):
        raise _Invalid("no boards")
    for key, entry in boards.items():
        watts = entry.get("idle_w") if isinstance(entry, dict) else None
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("model"), str)
            and isinstance(watts, (int, float))
            and not isinstance(watts, bool)
            and plausible_idle_w(watts)
        ):
            raise _Invalid(f"bad entry for {key}")
    return boards
