"""Constants the BPF programs and user space share, defined once, here and in the probe
modules: C never restates them. The shared ones (gj_config's slots and flag bits) are written
into gpujitter.h's place by bpf_source; a probe's own go to its compile as -D options.
"""

from __future__ import annotations

from collections.abc import Mapping

# gj_config slots, and the bits of its GJ_CFG_FLAGS slot (gpujitter.h's config map).
CFG_FLAGS, CFG_SELF_TGID, CFG_GEN = 0, 1, 2
WATCH_ALL = 1

SHARED: Mapping[str, int] = {
    "GJ_CFG_FLAGS": CFG_FLAGS,
    "GJ_CFG_SELF_TGID": CFG_SELF_TGID,
    "GJ_CFG_GEN": CFG_GEN,  # bumped on every change of the watched set (cached lookups check it)
    "GJ_WATCH_ALL": WATCH_ALL,
}


def cflags(constants: Mapping[str, int]) -> list[str]:
    """-D options that define each constant for one compile."""
    return [f"-D{name}={value}" for name, value in constants.items()]


def indexes(prefix: str, names: tuple[str, ...], count: bool = True) -> dict[str, int]:
    """A C enumeration from a Python tuple: PREFIX_NAME -> its index, and PREFIX_COUNT (the
    size of an array indexed by it) unless `count` is False."""
    out = {f"{prefix}_{name.upper()}": n for n, name in enumerate(names)}
    return {**out, f"{prefix}_COUNT": len(names)} if count else out


def header_lines() -> list[str]:
    """The shared constants as #define lines, pasted ahead of gpujitter.h."""
    return [f"#define {name} {value}" for name, value in SHARED.items()]
