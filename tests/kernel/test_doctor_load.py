"""`gpujitter doctor --load` on this kernel: the core module and every registered probe are
really loaded for a moment, and fentry is really tried."""

from __future__ import annotations

from gpujitter.daemon.doctor import DoctorEnv, can_profile, check_load, check_unused_hooks
from gpujitter.probes import registry


def test_load_core_and_every_probe() -> None:
    results = list(check_load(DoctorEnv(load=True, load_s=0.3)))
    assert results[0].check == "load core" and results[0].status == "pass"
    loaded = {r.check.removeprefix("load "): r for r in results[1:]}
    assert set(loaded) == set(registry.specs())
    # malloc's tracepoints exist on this kernel: it must really run.
    assert loaded["malloc"].status == "pass" and loaded["malloc"].detail == "running"
    assert can_profile(results)


def test_fentry_is_really_tried() -> None:
    _kprobes, fentry = list(check_unused_hooks(DoctorEnv(load=True)))
    assert fentry.status == "info"
    # This kernel refuses tracing programs (ENVIRONMENT.md); either answer must be a real one.
    assert fentry.detail.startswith(("refused (", "available;")), fentry.detail
    assert "not tried" not in fentry.detail
