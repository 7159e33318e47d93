"""The probe registry: every probe, its default, the kernel hooks it needs and what is
lost when it cannot run. `gpujitter doctor`, `gpujitter probe` and the daemon all read it,
so switches and health reporting come from one place (as node_exporter's collector registry).

A probe module declares `SPECS`, a tuple of ProbeSpec; the modules are listed in
PROBE_MODULES and imported on first use. Probe modules import bcc only when started, so the
registry itself loads on a node without bcc (where doctor must still run).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gpujitter.probes.base import Probe

PROBE_MODULES = ("sched", "cstate", "irq", "faults", "malloc", "cuda",
                 "python_gc", "python_gil", "python_stacks")  # fmt: skip

TRACEFS = Path("/sys/kernel/tracing")


def tracepoint_exists(target: str) -> bool:
    """Whether this kernel has the tracepoint "category:name" (tracefs lists it)."""
    category, _, name = target.partition(":")
    return (TRACEFS / "events" / category / name).is_dir()


@dataclass(frozen=True, slots=True)
class Hook:
    """One kernel attachment point. kind: tracepoint ("sched:sched_switch"), perf_event
    ("software:page-faults-maj"), uprobe ("libc:malloc") or usdt ("python:gc__start": a
    marker of the runtime the watched processes run). An optional hook only narrows what
    the probe reports (its `degrades` text says how) when it is missing."""

    kind: Literal["tracepoint", "perf_event", "uprobe", "usdt"]
    target: str
    optional: bool = False

    def __str__(self) -> str:
        return f"{self.kind} {self.target}"


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    name: str
    summary: str
    default_on: bool
    hooks: tuple[Hook, ...]
    degrades: str  # what the operator loses when this probe cannot run
    factory: Callable[[ProbeSpec], Probe] = field(repr=False, compare=False)
    # Emission thresholds in ns, configurable per probe: name -> default.
    thresholds: dict[str, int] = field(default_factory=dict)
    # Why a probe is off by default, in one line (doctor shows it); required when default_on
    # is False. Such a probe runs when named: `gpujitter probe NAME`, `probes.enable`.
    off_reason: str = ""

    def __post_init__(self) -> None:
        if not self.default_on and not self.off_reason:
            raise ValueError(f"probe {self.name!r} is off by default without an off_reason")


_SPECS: dict[str, ProbeSpec] = {}


def specs() -> dict[str, ProbeSpec]:
    """All registered probes by name, in PROBE_MODULES order."""
    if not _SPECS:
        for module in PROBE_MODULES:
            for spec in importlib.import_module(f"gpujitter.probes.{module}").SPECS:
                if spec.name in _SPECS:
                    raise ValueError(f"probe {spec.name!r} registered twice")
                _SPECS[spec.name] = spec
    return dict(_SPECS)


def get(name: str) -> ProbeSpec:
    from gpujitter.errors import GpujitterError

    all_specs = specs()
    if name not in all_specs:
        raise GpujitterError(f"unknown probe {name!r}; known: {', '.join(all_specs)}")
    return all_specs[name]


def default_names() -> list[str]:
    return [name for name, spec in specs().items() if spec.default_on]


def select(names: Sequence[str] = (), disabled: Sequence[str] = ()) -> list[str]:
    """The probes to run, from what a user named: plain names are exactly those ("sched,irq"),
    "+name" adds to them or, alone, to the default set ("+faults,+swap": the default set and
    faults and swap); `disabled` is taken out, whatever named it (a node's variable may
    disable what a shared file enables). Each name may be a comma-separated list, as
    `--probes` takes one (`probe sched,irq` is `probe sched irq`). Unknown names: a one-line
    error."""
    names = [n.strip() for item in names for n in item.split(",") if n.strip()]
    plain = [n for n in names if not n.startswith("+")]
    added = [n[1:] for n in names if n.startswith("+")]
    for name in [*plain, *added, *disabled]:
        get(name)
    chosen = list(dict.fromkeys([*(plain or default_names()), *added]))
    return [n for n in chosen if n not in disabled]
