"""The daemon's configuration: a TOML file, then GPUJITTER_* environment variables, then
command-line flags (flags win). Every setting is declared once in SETTINGS with its type,
default and help; unknown keys and bad values are refused with one line naming the source
(file, variable or flag) and what was expected.

File layout: a setting "socket.path" is key `path` of table [socket]. Its environment
variable is GPUJITTER_SOCKET_PATH. See systemd/gpujitter.toml for an annotated example.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpujitter.errors import GpujitterError
from gpujitter.tomlfile import load_toml
from gpujitter.units import parse_duration_ns, parse_size_bytes

DEFAULT_PATH = Path("/etc/gpujitter/gpujitter.toml")


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError("expected a string")
    return v


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return v.lower() in ("1", "true", "yes", "on")
    raise ValueError("expected true or false")


def _int(v: Any) -> int:
    if isinstance(v, bool):
        raise ValueError("expected an integer")
    return int(v)


def _duration(v: Any) -> int:
    return parse_duration_ns(str(v)) if isinstance(v, str) else _int(v)


def _size(v: Any) -> int:
    return parse_size_bytes(v if isinstance(v, str) else _int(v))


def _mode(v: Any) -> int:
    """File modes are written as octal strings ("0660"); a TOML integer is taken as octal
    digits too (0660 written bare would be decimal 660, which nobody means)."""
    mode = int(str(v), 8)
    if not 0 <= mode <= 0o777:
        raise ValueError('expected an octal file mode like "0660"')
    return mode


def _list(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):  # environment and flags: comma-separated
        return tuple(s.strip() for s in v.split(",") if s.strip())
    if isinstance(v, list) and all(isinstance(s, (str, int)) for s in v):
        return tuple(str(s) for s in v)
    raise ValueError("expected a list of strings")


def _pids(v: Any) -> tuple[int, ...]:
    return tuple(int(p) for p in _list(v))


def _thresholds(v: Any) -> tuple[tuple[str, int], ...]:
    """{"sched.offcpu" = "1ms"} (file) or "sched.offcpu=1ms,irq.stolen=50us" (env, flags)."""
    items = v.items() if isinstance(v, dict) else (s.partition("=")[::2] for s in _list(v))
    out = []
    for key, value in items:
        if "." not in key or value == "":
            raise ValueError('expected PROBE.KEY = TIME entries, e.g. sched.offcpu = "1ms"')
        out.append((str(key), _duration(value)))
    return tuple(sorted(out))


@dataclass(frozen=True, slots=True)
class Setting:
    key: str  # "section.name"
    parse: Callable[[Any], Any]
    default: Any
    help: str

    @property
    def env(self) -> str:
        return "GPUJITTER_" + self.key.replace(".", "_").upper()


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "probes.enable",
        _list,
        (),
        'probes to run; empty: every probe on by default; "+name" adds one to that set',
    ),
    Setting("probes.disable", _list, (), "probes not to run"),
    Setting("probes.thresholds", _thresholds, (), "emission thresholds, PROBE.KEY = TIME"),
    Setting("watch.pids", _pids, (), "process ids to watch"),
    Setting("watch.comms", _list, (), "command-name patterns to watch ('python*')"),
    Setting("watch.cgroups", _list, (), "cgroup directories whose processes are watched"),
    Setting("watch.gpu_processes", _bool, True, "watch every process using a GPU"),
    Setting("topology.override", _str, "", "topology override file (emulated NUMA nodes)"),
    Setting("log.path", _str, "/var/log/gpujitter/attributions.jsonl", "attribution log"),
    Setting("log.max_bytes", _size, 64 * 1024**2, "rotate the log at this size"),
    Setting("log.keep", _int, 8, "rotated log files kept"),
    Setting("record.path", _str, "", "record the raw event stream here (empty: off)"),
    Setting("record.max_bytes", _size, 256 * 1024**2, "rotate the trace at this size"),
    Setting("record.keep", _int, 8, "rotated trace files kept"),
    Setting("socket.path", _str, "/run/gpujitter/gpujitter.sock", "stream socket"),
    Setting("socket.group", _str, "", "group owning the socket (empty: root's)"),
    Setting("socket.mode", _mode, 0o660, "socket file mode"),
    Setting("socket.queue", _int, 4096, "messages queued per client before dropping"),
    Setting("metrics.listen", _str, "", "Prometheus metrics on HOST:PORT (empty: off)"),
    Setting(
        "state.dir",
        _str,
        "/var/lib/gpujitter",
        "what the daemon learns and keeps across restarts: each GPU's idle power (empty: none)",
    ),
)
_BY_KEY = {s.key: s for s in SETTINGS}


@dataclass(frozen=True, slots=True)
class Config:
    values: Mapping[str, Any]
    sources: Mapping[str, str]  # key -> where its value came from (default, file, env, flag)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def explain(self) -> list[tuple[str, Any, str]]:
        return [(s.key, self.values[s.key], self.sources[s.key]) for s in SETTINGS]


def _parse(setting: Setting, raw: Any, source: str) -> Any:
    try:
        return setting.parse(raw)
    except (ValueError, TypeError, GpujitterError) as err:
        raise GpujitterError(f"{source}: {setting.key}: {err} (got {raw!r})") from None


def read_file(path: Path) -> dict[str, Any]:
    """Flattened {"section.key": raw value} from a TOML file."""
    data = load_toml(path, "config")
    flat: dict[str, Any] = {}
    for section, table in data.items():
        if not isinstance(table, dict):
            raise GpujitterError(f"config {path}: `{section}` must be a [table]")
        for key, value in table.items():
            name = f"{section}.{key}"
            if name not in _BY_KEY:
                raise GpujitterError(f"config {path}: unknown setting {name} ({_near(name)})")
            flat[name] = value
    return flat


def _near(name: str) -> str:
    section = name.partition(".")[0]
    same = [s.key for s in SETTINGS if s.key.startswith(section + ".")]
    return "known in [" + section + "]: " + ", ".join(same) if same else "see gpujitter run --help"


def load_config(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Defaults < file < environment < flags. `path` None means the default path if it
    exists; a path given explicitly must exist."""
    env = os.environ if environ is None else environ
    values = {s.key: s.default for s in SETTINGS}
    sources = dict.fromkeys(values, "default")
    if path is None and DEFAULT_PATH.is_file():
        path = DEFAULT_PATH
    if path is not None:
        for key, raw in read_file(path).items():
            values[key] = _parse(_BY_KEY[key], raw, f"config {path}")
            sources[key] = str(path)
    for var in sorted(k for k in env if k.startswith("GPUJITTER_")):
        setting = next((s for s in SETTINGS if s.env == var), None)
        if setting is None:
            continue  # GPUJITTER_* variables of other tools or later versions
        values[setting.key] = _parse(setting, env[var], f"environment {var}")
        sources[setting.key] = f"env {var}"
    for key, raw in (flags or {}).items():
        if raw is None:
            continue
        values[key] = _parse(_BY_KEY[key], raw, "flag --" + key.replace(".", "-").replace("_", "-"))
        sources[key] = "flag"
    return Config(values=values, sources=sources)
