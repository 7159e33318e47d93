"""The daemon's configuration: a TOML file, then GPUJITTER_* environment variables, then
command-line flags (flags win). Every setting is declared once in SETTINGS with its type,
range, default and help; unknown keys and bad values are refused with one line naming the
origin (file, variable or flag), the key, the value and what is allowed. `check_node` then
checks what the values name on this node (directories, cgroups, the metrics port), so that
every mistake is found before a probe is attached.

File layout: a setting "socket.path" is key `path` of table [socket]. Its environment
variable is GPUJITTER_SOCKET_PATH. See systemd/gpujitter.toml for an annotated example.
"""

from __future__ import annotations

import grp
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpujitter.daemon.sinks.jsonlog import IN_USE, in_use
from gpujitter.daemon.sinks.stream import refuse_if_served, too_long_for_a_socket
from gpujitter.errors import GpujitterError
from gpujitter.probes import registry
from gpujitter.probes.host import HostPaths
from gpujitter.probes.topology import check_override, read_cpu_nodes
from gpujitter.text import quoted
from gpujitter.tomlfile import load_toml
from gpujitter.units import parse_duration_ns, parse_size_bytes, with_unit

DEFAULT_PATH = Path("/etc/gpujitter/gpujitter.toml")
# A threshold longer than this would stream nothing (and "100000000h" no longer fits the u64
# that the BPF programs compare against: their compile fails and the probe is left out).
MAX_THRESHOLD_NS = 3_600_000_000_000
# Past this a "gap" is an idle GPU, which the NVML utilisation already shows.
MAX_MIN_GAP_NS = 10_000_000_000
# Records a stream client may fall behind by; a client further behind is better told it
# lost records than held in the daemon's memory (MemoryMax in the unit).
MAX_SOCKET_QUEUE = 1 << 20
# And at least: each second the daemon publishes a status, a record per probe and one per
# CPU at once, faster than the stream thread sends them; a queue shorter than that burst
# dropped records of a client that reads without pause (4 lost half the statuses on 2 CPUs).
MIN_SOCKET_QUEUE = 256
PID_MAX = Path("/proc/sys/kernel/pid_max")
# The kernel's ceiling on 64-bit machines, if pid_max cannot be read.
PID_MAX_LIMIT = 4_194_304


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError("expected a string")
    return v


def _path(v: Any) -> str:
    """A file or directory name; empty means none. A NUL cannot be in a name: the kernel
    would take the path cut short at it (a socket bound there), Python refuses it late."""
    text = _str(v)
    if "\0" in text:
        raise ValueError("a path cannot contain a NUL character")
    return text


def _paths(v: Any) -> tuple[str, ...]:
    paths = _list(v)
    for path in paths:
        _path(path)
    return paths


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return v.lower() in ("1", "true", "yes", "on")
    raise ValueError("expected true or false")


_MAX_DIGITS = 19  # of MAX_SETTING; more is no setting (and int() refuses past 4,300)


def _int(v: Any) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and re.fullmatch(r"\s*[-+]?\d+\s*", v):
        if len(v.strip().lstrip("+-").lstrip("0")) > _MAX_DIGITS:
            raise ValueError("expected a whole number of at most 19 digits")
        return int(v)
    raise ValueError("expected a whole number")


# The largest count or size any setting takes: what a 64-bit signed field holds (the JSON
# of --print-config, the daemon's status), far past any file size or count that means
# something; past it a value is a mistake, not a wish.
MAX_SETTING = (1 << 63) - 1


def _at_least(low: int, high: int = MAX_SETTING) -> Callable[[Any], int]:
    """A parser of whole numbers from `low` to `high`."""

    def parse(v: Any) -> int:
        n = _int(v)
        if n < low or n > high:
            raise ValueError(f"expected at least {low} and at most {high}")
        return n

    return parse


def _duration(v: Any) -> int:
    return parse_duration_ns(str(v)) if isinstance(v, str) else _int(v)


def _gap_length(v: Any) -> int:
    """The shortest GPU idle stretch reported: above 0, at most MAX_MIN_GAP_NS."""
    ns = _duration(v)
    if not 0 < ns <= MAX_MIN_GAP_NS:
        raise ValueError("expected a time above 0 and at most 10s")
    return ns


def _size(v: Any) -> int:
    n = parse_size_bytes(v) if isinstance(v, str) else _int(v)
    if not 0 <= n <= MAX_SETTING:
        raise ValueError("expected at least 0 bytes and at most 8 EiB")
    return n


def _mode(v: Any) -> int:
    """File modes are octal strings ("0660"). A TOML integer is refused: 0o660 arrives as 432
    and 660 as 660, and reading either as octal digits turned 0o660 into 0o432, a socket
    others may write to."""
    if not isinstance(v, str):
        raise ValueError('expected an octal file mode as a string, like "0660"')
    try:
        mode = int(v, 8)
    except ValueError:
        raise ValueError('expected an octal file mode like "0660"') from None
    if not 0 <= mode <= 0o777:
        raise ValueError('expected an octal file mode like "0660"')
    return mode


def _list(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):  # environment and flags: comma-separated
        return tuple(s.strip() for s in v.split(",") if s.strip())
    # Whole numbers are words too (slurm_jobs = [4121]); true is no name of anything.
    if isinstance(v, list) and all(
        isinstance(s, (str, int)) and not isinstance(s, bool) for s in v
    ):
        return tuple(str(s) for s in v)
    raise ValueError("expected a list of strings")


def pid_max() -> int:
    """The highest process id this kernel hands out."""
    try:
        return int(PID_MAX.read_text())
    except (OSError, ValueError):
        return PID_MAX_LIMIT


def _pids(v: Any) -> tuple[int, ...]:
    top = pid_max()
    # A TOML list is taken as it is, so that [1.5] is called a bad number, not a bad string.
    pids = tuple(_int(p) for p in (v if isinstance(v, list) else _list(v)))
    for pid in pids:
        if not 1 <= pid <= top:
            raise ValueError(f"process id {pid}: expected one from 1 to {top} (kernel.pid_max)")
    return pids


# Kubernetes object names (RFC 1123 labels and subdomains): what a pod or namespace may be.
_KUBE_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")


def _pods(v: Any) -> tuple[str, ...]:
    """Pods as NAME or NAMESPACE/NAME."""
    pods = _list(v)
    for pod in pods:
        parts = pod.split("/")
        if len(parts) > 2 or not all(_KUBE_NAME.fullmatch(p) for p in parts):
            raise ValueError(f"pod {pod!r}: expected NAME or NAMESPACE/NAME (lower-case DNS names)")
    return pods


def _comms(v: Any) -> tuple[str, ...]:
    """Command-name patterns, shell style."""
    comms = _list(v)
    if "" in comms:  # it was taken, and watched nothing
        raise ValueError("an empty pattern matches no command name")
    return comms


def _slurm_jobs(v: Any) -> tuple[str, ...]:
    jobs = _list(v)
    for job in jobs:
        if not job.isdecimal() or not job.isascii():
            raise ValueError(f"Slurm job {job!r}: expected a job id (digits)")
    return jobs


def _probes(v: Any) -> tuple[str, ...]:
    """Names of registered probes."""
    names = _list(v)
    for name in names:
        registry.get(name)
    return names


def _enabled_probes(v: Any) -> tuple[str, ...]:
    """Names of registered probes, "+name" adding one to the default set."""
    names = _list(v)
    _probes([n.removeprefix("+") for n in names])
    return names


def _thresholds(v: Any) -> tuple[tuple[str, int], ...]:
    """{"sched.offcpu" = "1ms"} (file) or "sched.offcpu=1ms,irq.stolen=50us" (env, flags);
    each names a threshold of a known probe and is from 0 (stream every interval) to
    MAX_THRESHOLD_NS; a window (irq.window, faults.minor_window) is a length, above 0."""
    items = v.items() if isinstance(v, dict) else (s.partition("=")[::2] for s in _list(v))
    out = []
    for key, value in items:
        probe, dot, name = str(key).partition(".")
        if not dot or value == "":
            raise ValueError('expected PROBE.KEY = TIME entries, e.g. sched.offcpu = "1ms"')
        known = registry.get(probe).thresholds
        if name not in known:
            raise ValueError(
                f"probe {probe} has no threshold {name!r} (it has: {', '.join(known)})"
            )
        ns = _duration(value)
        least = 1 if name.endswith("window") else 0
        if not least <= ns <= MAX_THRESHOLD_NS:
            low = "above 0" if least else "from 0"
            raise ValueError(f"{key} = {value!r}: expected a time {low} and at most 1h")
        out.append((str(key), ns))
    return tuple(sorted(out))


def probe_names(config: Config) -> list[str]:
    """The probes the settings select (registry.select)."""
    return registry.select(config["probes.enable"], config["probes.disable"])


def thresholds_by_probe(entries: Iterable[tuple[str, int]]) -> dict[str, dict[str, int]]:
    """(("sched.offcpu", 1_000_000),) -> {"sched": {"offcpu": 1_000_000}}, as probes take them."""
    out: dict[str, dict[str, int]] = {}
    for key, ns in entries:
        probe, _, name = key.partition(".")
        out.setdefault(probe, {})[name] = ns
    return out


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT -> (host, port); an IPv6 address goes in brackets ("[::1]:9464"), and no
    host means 127.0.0.1."""
    m = re.fullmatch(r"(?:\[([^\[\]]+)\]|([^:\[\]]*)):(\d+)", text)
    if not m:
        raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:9464 or [::1]:9464")
    port = int(m.group(3))
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port}: expected one from 1 to 65535")
    return m.group(1) or m.group(2) or "127.0.0.1", port


def _listen(v: Any) -> str:
    text = _str(v)
    if text:
        parse_listen(text)
    return text


@dataclass(frozen=True, slots=True)
class Setting:
    key: str  # "section.name"
    parse: Callable[[Any], Any]
    default: Any
    help: str
    shown: Callable[[Any], Any] = lambda value: value  # as --print-config shows it
    # The unit of a bare number typed after a flag, where people type it in another unit
    # than the file's ns (--min-gap 5 is 5 ms, as in `gaps --min-gap`); in the variable, where
    # a bare number meant ns until 2026-12 and either unit can be meant, one is asked for.
    typed_unit: str | None = None

    @property
    def env(self) -> str:
        return "GPUJITTER_" + self.key.replace(".", "_").upper()

    def typed(self, raw: Any) -> Any:
        """`raw` from a flag, its bare number in `typed_unit`."""
        return with_unit(raw, self.typed_unit) if self.typed_unit and isinstance(raw, str) else raw

    def from_env(self, raw: str) -> str:
        """`raw` from the variable; GpujitterError for a bare number where units differ."""
        if self.typed_unit and with_unit(raw, self.typed_unit) != raw:
            raise GpujitterError(
                f"environment {self.env}: {self.key}: give a unit, e.g. 5{self.typed_unit} "
                f"(a bare number is ns in the file, {self.typed_unit} after the flag)"
            )
        return raw


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "probes.enable",
        _enabled_probes,
        (),
        'probes to run; empty: every probe on by default; "+name" adds one to that set',
    ),
    Setting("probes.disable", _probes, (), "probes not to run"),
    Setting("probes.thresholds", _thresholds, (), "emission thresholds, PROBE.KEY = TIME"),
    Setting("watch.pids", _pids, (), "process ids to watch"),
    Setting("watch.comms", _comms, (), "command-name patterns to watch ('python*')"),
    Setting("watch.cgroups", _paths, (), "cgroup directories whose processes are watched"),
    Setting("watch.pods", _pods, (), "Kubernetes pods (NAME or NAMESPACE/NAME) to watch"),
    Setting("watch.slurm_jobs", _slurm_jobs, (), "Slurm job ids whose processes are watched"),
    Setting("watch.gpu_processes", _bool, True, "watch every process using a GPU"),
    Setting("topology.override", _path, "", "topology override file (emulated NUMA nodes)"),
    Setting("log.path", _path, "/var/log/gpujitter/attributions.jsonl", "attribution log"),
    Setting("log.max_bytes", _size, 64 * 1024**2, "rotate the log at this size"),
    Setting("log.keep", _at_least(0), 8, "log files kept, the current one counted (0: no limit)"),
    Setting("record.path", _path, "", "record the raw event stream here (empty: off)"),
    Setting("record.max_bytes", _size, 256 * 1024**2, "rotate the trace at this size"),
    Setting(
        "record.keep", _at_least(0), 8, "trace files kept, the current one counted (0: no limit)"
    ),
    Setting("socket.path", _path, "/run/gpujitter/gpujitter.sock", "stream socket"),
    Setting("socket.group", _str, "", "group owning the socket (empty: root's)"),
    Setting("socket.mode", _mode, 0o660, "socket file mode", shown=lambda mode: f"{mode:04o}"),
    Setting(
        "socket.queue",
        _at_least(MIN_SOCKET_QUEUE, MAX_SOCKET_QUEUE),
        4096,
        "messages queued per client before dropping",
    ),
    Setting("metrics.listen", _listen, "", "Prometheus metrics on HOST:PORT (empty: off)"),
    Setting(
        "gaps.min_gap",
        _gap_length,
        5_000_000,
        "GPU idle stretches shorter than this are not reported",
        typed_unit="ms",
    ),
    Setting(
        "state.dir",
        _path,
        "/var/lib/gpujitter",
        "what the daemon learns and keeps across restarts: each GPU's idle power (empty: none)",
    ),
)
_BY_KEY = {s.key: s for s in SETTINGS}


@dataclass(frozen=True, slots=True)
class Config:
    values: Mapping[str, Any]
    # key -> where its value came from, as errors name it: "default", "config PATH",
    # "environment VARIABLE" or "flag --NAME"
    origins: Mapping[str, str]

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def explain(self) -> list[tuple[str, Any, str]]:
        return [(s.key, s.shown(self.values[s.key]), self.origins[s.key]) for s in SETTINGS]


def parse_value(key: str, raw: Any, origin: str) -> Any:
    """One setting's value from `raw`; a bad one is a GpujitterError naming `origin`, the
    key, what was expected and the value. The other commands' options of the same meaning
    (--pid, --threshold) are checked here too."""
    try:
        return _BY_KEY[key].parse(raw)
    except (ValueError, TypeError, GpujitterError) as err:
        raise GpujitterError(f"{origin}: {key}: {err} (got {quoted(raw)})") from None


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
    flags: Mapping[str, tuple[str, Any]] | None = None,
) -> Config:
    """Defaults < file < environment < flags. `path` None means the default path if it
    exists; a path given explicitly must exist. `flags`: key -> (the option as typed, which
    errors name; its value, None when not given)."""
    env = os.environ if environ is None else environ
    values = {s.key: s.default for s in SETTINGS}
    origins = dict.fromkeys(values, "default")
    given: list[tuple[str, Any, str]] = []
    # The default path where something is there: a directory or a dangling link there is
    # refused as it would be given by name, not skipped without a word.
    if path is None and os.path.lexists(DEFAULT_PATH):
        path = DEFAULT_PATH
    if path is not None:
        given += [(key, raw, f"config {path}") for key, raw in read_file(path).items()]
    tables = {s.key.partition(".")[0] for s in SETTINGS}
    for var in sorted(k for k in env if k.startswith("GPUJITTER_")):
        setting = next((s for s in SETTINGS if s.env == var), None)
        if setting is not None:
            given.append((setting.key, setting.from_env(env[var]), f"environment {var}"))
            continue
        # One of a table of ours is a typo (GPUJITTER_SOCKET_GROUPS), refused as the file
        # refuses an unknown key; any other is another tool's (GPUJITTER_DEBUG).
        table = var.removeprefix("GPUJITTER_").partition("_")[0].lower()
        if table in tables:
            known = ", ".join(s.env for s in SETTINGS if s.key.startswith(table + "."))
            raise GpujitterError(f"environment {var}: unknown setting (known: {known})")
    given += [
        (key, _BY_KEY[key].typed(raw), f"flag {flag}")
        for key, (flag, raw) in (flags or {}).items()
        if raw is not None
    ]
    for key, raw, origin in given:
        values[key] = parse_value(key, raw, origin)
        origins[key] = origin
    return Config(values=values, origins=origins)


# -- what the values name on this node -------------------------------------------------


def check_cgroup(path: Path) -> None:
    try:
        procs = (path / "cgroup.procs").is_file()
    except OSError as err:  # a name the kernel will not look up (too long): not "missing"
        raise ValueError(f"{quoted(str(path))}: {err.strerror}") from None
    if not procs:
        raise ValueError(f"{path} is not a cgroup directory (no cgroup.procs)")


def check_parent(path: Path) -> None:
    """A file (or rotated directory) to be made at `path`: the directory it goes in must
    exist, since making missing parents would scatter directories over the file system."""
    if not path.parent.is_dir():
        raise ValueError(f"directory {path.parent} does not exist")


def own_dir(path: Path, mode: int) -> None:
    """A directory the daemon keeps files in (its socket's, its log's, its state). Under
    systemd the unit makes it (RuntimeDirectory, LogsDirectory, StateDirectory); started by
    hand, the daemon makes that one directory where its parent exists, never the parents."""
    if path.is_dir():
        return
    if not path.parent.is_dir():
        raise ValueError(f"directory {path} does not exist, nor its parent {path.parent}")
    try:
        path.mkdir(mode=mode)
    except OSError as err:
        raise ValueError(f"cannot create {path}: {err.strerror}") from None


def _cgroups(dirs: tuple[str, ...]) -> None:
    for d in dirs:
        check_cgroup(Path(d))


def writable(folder: Path) -> None:
    """Whether files can be made in `folder` now (read-only file system, permissions): asked
    before any probe is built, not found at the first write."""
    if not os.access(folder, os.W_OK | os.X_OK):
        why = "read-only file system" if _read_only(folder) else "permission denied"
        raise ValueError(f"cannot write in {folder}: {why}")


def _read_only(folder: Path) -> bool:
    try:
        return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _log_path(value: str) -> None:
    path = Path(value)
    own_dir(path.parent, 0o750)
    if path.is_symlink():  # the log is never written through a link (sinks/jsonlog.py)
        raise ValueError(f"{value} is a symbolic link; give the file's own path")
    if path.is_dir():
        raise ValueError(f"{value} is a directory; the log is a file")
    if path.exists() and not path.is_file():
        raise ValueError(f"{value} is not a regular file")
    if in_use(path):
        raise ValueError(IN_USE)
    writable(path.parent)


def _record_path(value: str) -> None:
    path = Path(value)
    check_parent(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{value} is a file; the daemon records into a directory")
    writable(path if path.is_dir() else path.parent)


def _socket_fits(value: str) -> None:
    if (why := too_long_for_a_socket(value)) is not None:
        raise ValueError(why)


def _socket_path(value: str) -> None:
    own_dir(Path(value).parent, 0o755)  # clients reach the socket through it (0660 itself)
    if Path(value).exists() and not Path(value).is_socket():
        raise ValueError(f"{value} exists and is not a socket")
    try:
        refuse_if_served(Path(value))
    except GpujitterError as err:
        raise ValueError(str(err).removeprefix(f"socket {value}: ")) from None


def _group(value: str) -> None:
    try:
        grp.getgrnam(value)
    except KeyError:
        raise ValueError(f"no such group {value!r}") from None


def check_listen_free(listen: str) -> None:
    """Bind HOST:PORT and let go: a port in use or a host that is not this node's is found
    now, not once the probes are attached."""
    host, port = parse_listen(listen)
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            # As the HTTP server does: a port whose last connections linger is free to it.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(addr)
    except OSError as err:
        raise ValueError(f"cannot listen there: {err.strerror or err}") from None


_NODE_CHECKS: dict[str, Callable[[Any], Any]] = {
    "watch.cgroups": _cgroups,
    # against this node's CPUs, as the start applies it
    "topology.override": lambda value: check_override(value, read_cpu_nodes(HostPaths())),
    "socket.group": _group,
    "socket.path": _socket_fits,  # (before its directory is made, at start)
}
# Checked only when the daemon starts: under systemd these directories are the unit's, made
# at start (and /run/gpujitter is gone while it is stopped), and a running daemon holds the
# metrics port.
_START_CHECKS: dict[str, Callable[[Any], Any]] = {
    "log.path": _log_path,
    "record.path": _record_path,
    "socket.path": _socket_path,
    "state.dir": lambda value: own_dir(Path(value), 0o750),
    "metrics.listen": check_listen_free,
}


def check_node(config: Config, *, starting: bool) -> None:
    """What the settings name on this node: cgroups, the topology override, the socket's
    group; when `starting`, also the directories of the log, the recordings and the socket,
    and the metrics address."""
    checks = [*_NODE_CHECKS.items(), *(_START_CHECKS.items() if starting else ())]
    for key, check in checks:
        value = config[key]
        if not value:
            continue
        try:
            check(value)
        except (ValueError, GpujitterError) as err:
            raise GpujitterError(
                f"{config.origins[key]}: {key}: {err} (got {quoted(value)})"
            ) from None
        except OSError as err:  # a name the kernel will not look up (too long)
            raise GpujitterError(
                f"{config.origins[key]}: {key}: {err.strerror} (got {quoted(value)})"
            ) from None
