"""NVML at the boundary, tapped and played back: TapBackend wraps pynvml on a real GPU
and notes every call (arguments, result or error); PlaybackBackend answers the same calls from
those notes, so tests run the production NVML code (probes/nvml.py) on machines without a
GPU. Device handles are recorded as "handle:N"; ctypes structures as dicts of their fields."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, ctypes.Structure):
        return {name: _plain(getattr(value, name)) for name, *_ in value._fields_}
    if isinstance(value, ctypes.Array | list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, int | float | str) or value is None:
        return value
    return repr(value)


class TapBackend:
    """pynvml, with every nvml* call appended to `calls`."""

    NVMLError = pynvml.NVMLError

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._handles: dict[int, str] = {}

    def _token(self, arg: Any) -> Any:
        address = ctypes.cast(arg, ctypes.c_void_p).value if _is_handle(arg) else None
        return self._handles.get(address, _plain(arg)) if address is not None else _plain(arg)

    def __getattr__(self, name: str) -> Any:
        real = getattr(pynvml, name)
        if not name.startswith("nvml") or not callable(real):
            return real

        def call(*args: Any) -> Any:
            entry: dict[str, Any] = {"fn": name, "args": [self._token(a) for a in args]}
            self.calls.append(entry)
            try:
                result = real(*args)
            except pynvml.NVMLError as err:
                entry["error"] = int(err.value)
                raise
            if name.startswith("nvmlDeviceGetHandleBy"):
                token = f"handle:{args[0]}"
                self._handles[ctypes.cast(result, ctypes.c_void_p).value or 0] = token
                entry["result"] = token
            else:
                entry["result"] = _plain(result)
            return result

        return call


def _is_handle(arg: Any) -> bool:
    return isinstance(arg, ctypes._Pointer)  # type: ignore[attr-defined]


class PlaybackBackend:
    """Answers nvml* calls from a tapped session: the same function with the same arguments gets
    the recorded results in order (the last one repeats); an unrecorded call is an error the
    test must see, not a silent None."""

    NVMLError = pynvml.NVMLError

    def __init__(self, calls: list[dict[str, Any]]) -> None:
        self._answers: dict[str, list[dict[str, Any]]] = {}
        for entry in calls:
            self._answers.setdefault(_key(entry["fn"], entry["args"]), []).append(entry)

    @classmethod
    def load(cls, path: Path) -> PlaybackBackend:
        return cls(json.loads(path.read_text()))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("NVMLError"):
            return getattr(pynvml, name)
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def call(*args: Any) -> Any:
            queue = self._answers.get(_key(name, list(args)))
            if not queue:
                raise AssertionError(f"NVML call not in the recording: {name}{tuple(args)}")
            entry = queue.pop(0) if len(queue) > 1 else queue[0]
            if "error" in entry:
                raise pynvml.NVMLError(entry["error"])
            return _namespace(entry.get("result"))

        return call


def _key(fn: str, args: list[Any]) -> str:
    return json.dumps([fn, args])


def _namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _namespace(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_namespace(v) for v in value]
    return value
