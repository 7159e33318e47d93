"""The drills' injections used outside a drill: bench/train_job.py builds an injector with
the params it has (no drill stage ran), as a real training job injects its stalls."""

from __future__ import annotations

import time

from gpujitter.daemon.drill.build import cached_inject
from gpujitter.daemon.drill.injectors import MinorFaultStorm, load_inject


def test_the_fault_storm_takes_the_probes_rule_from_the_probe_not_from_a_stage() -> None:
    # On the H100 (2026-12-06) the real job died at its faults scenario: KeyError
    # 'storm_stretch', a parameter only the drill's stage set.
    storm = MinorFaultStorm(load_inject(str(cached_inject())), 5_000_000, {})
    try:
        storm.setup()
        storm.background()  # maps the stall's region while the GPU is busy
        facts = storm.inject(time.monotonic_ns() + 5_000_000)
    finally:
        storm.close()
    # It faults from the stall's start (nothing slow loaded in it first) to its deadline:
    # the truth is the stall less what the probe's rule leaves untimed, a fault or two past.
    assert facts["pages"] > 0 and not facts["short"]
    assert 0 < facts["cause_ns"] <= 5_000_000 - facts["untimed_ns"] + 2_000_000
