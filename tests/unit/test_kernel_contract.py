"""The constants the BPF programs share with user space are defined once, in Python, and reach
the compiler from there (probes/contract.py): no .bpf.c or gpujitter.h restates one, an
enumeration's members in C are all defined by Python, and the loader hands them over."""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

from gpujitter.probes import contract
from gpujitter.probes.base import BPF_DIR, SHARED_HEADER, ProbeContext, ProbeUnavailable, bpf_source
from gpujitter.probes.cstate import CstateProbe
from gpujitter.probes.registry import get
from gpujitter.probes.topology import Topology

PROBES_DIR = BPF_DIR.parent
SOURCES = sorted(PROBES_DIR.glob("*.bpf.c"))


def constants_of(source: Path) -> Mapping[str, int]:
    """What the module that loads `source` hands its compile (watch.bpf.c: watch.py)."""
    stem = source.name.removesuffix(".bpf.c")
    try:
        module = importlib.import_module(f"gpujitter.probes.{stem}")
    except ModuleNotFoundError:
        return {}
    return dict(getattr(module, "CONSTANTS", {}))


def code(source: Path) -> str:
    """The C text without its comments (a name in a comment neither defines nor uses it),
    with the probe's own headers it includes from probes/bpf (python_stacks_budget.h)."""
    text = source.read_text()
    for name in re.findall(r'^\s*#\s*include\s+"(\w+\.h)"', text, re.M):
        if name != SHARED_HEADER and (BPF_DIR / name).is_file():
            text += (BPF_DIR / name).read_text()
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)


def defined_in_c(text: str) -> set[str]:
    """Names the C text defines itself: macros and enumeration members."""
    names = set(re.findall(r"^\s*#\s*define\s+(\w+)", text, re.M))
    for body in re.findall(r"\benum\s*\w*\s*\{([^}]*)\}", text):
        names |= set(re.findall(r"(?:^|,)\s*([A-Za-z_]\w*)", body))
    return names


def test_every_source_names_a_constant_user_space_defines() -> None:
    assert {s.name for s in SOURCES} >= {"sched.bpf.c", "irq.bpf.c", "watch.bpf.c"}
    assert constants_of(PROBES_DIR / "sched.bpf.c")["ST_UNINTERRUPTIBLE"] == 2
    assert constants_of(PROBES_DIR / "watch.bpf.c")["GJ_WHY_FORK"] == 0x80


@pytest.mark.parametrize("source", [*SOURCES, BPF_DIR / SHARED_HEADER], ids=lambda p: p.name)
def test_c_never_restates_a_constant(source: Path) -> None:
    text = code(source)
    given = set(constants_of(source)) | set(contract.SHARED)
    assert not defined_in_c(text) & given, f"{source.name} defines what Python defines"
    for name in constants_of(source):
        assert re.search(rf"\b{name}\b", text), f"{name} is handed to {source.name}, unused"


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_an_enumeration_has_no_member_python_lacks(source: Path) -> None:
    """An enumeration passed from a Python tuple (PREFIX_..., PREFIX_COUNT): a member that
    the C text uses but Python does not define would be a state Python cannot name."""
    given = constants_of(source)
    used = set(re.findall(r"\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b", code(source)))
    for count in (n for n in given if n.endswith("_COUNT")):
        prefix = count.removesuffix("COUNT")
        assert {n for n in used if n.startswith(prefix)} <= set(given), source.name


def test_the_shared_constants_come_ahead_of_the_header() -> None:
    text = bpf_source(PROBES_DIR / "sched.bpf.c")
    header_at = text.index(f'#line 1 "{BPF_DIR / SHARED_HEADER}"')
    for name, value in contract.SHARED.items():
        assert text.index(f"#define {name} {value}\n") < header_at


def test_a_probe_hands_its_constants_to_the_compiler() -> None:
    probe = CstateProbe(get("cstate"))
    flags = probe.cflags(ProbeContext(topology=Topology(cpu_node={0: 0}), emit=lambda ev: True))
    assert "-DIDLE_STATES=16" in flags


@pytest.mark.parametrize("name", ["cuda", "python_gc", "python_gil", "python_stacks"])
def test_a_probe_that_needs_the_watched_set_does_not_start_without_it(name: str) -> None:
    """The probes that find their processes in the core's watched set refuse to start,
    in one line, where the core is not loaded (before any compile)."""
    spec = get(name)
    ctx = ProbeContext(topology=Topology(cpu_node={0: 0}), emit=lambda ev: True)
    with pytest.raises(ProbeUnavailable, match=r"^no watched set to \w+ \(the core module"):
        spec.factory(spec).start(ctx)
    ctx.shared["core"] = core = object()
    assert ctx.watched_set("scan") is core
