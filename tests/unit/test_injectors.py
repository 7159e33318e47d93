"""The drills' injections used outside a drill: bench/train_job.py builds an injector with
the params it has (no drill stage ran), as a real training job injects its stalls."""

from __future__ import annotations

import time

from gpujitter.daemon.drill.build import cached_inject
from gpujitter.daemon.drill.injectors import MinorFaultStorm, load_inject


def test_the_fault_storm_takes_the_probes_rule_from_the_probe_not_from_a_stage() -> None:
    # On the H100 (2026-12-06) the real job died at its faults scenario: KeyError
    # 'storm_stretch', a parameter only the drill's stage set.
    # 20 ms: a thread that shares its CPU with a spinner may wait a few ms to run before its
    # storm starts, and a 5 ms deadline could pass before its first fault.
    stall_ns = 20_000_000
    storm = MinorFaultStorm(load_inject(str(cached_inject())), stall_ns, {})
    try:
        storm.setup()
        storm.background()  # maps the stall's region while the GPU is busy
        wall0, cpu0 = time.monotonic_ns(), time.thread_time_ns()
        facts = storm.inject(wall0 + stall_ns)
        off_cpu = (time.monotonic_ns() - wall0) - (time.thread_time_ns() - cpu0)
    finally:
        storm.close()
    # It faults from the stall's start (nothing slow loaded in it first) to its deadline:
    # the truth is the stall less what the probe's rule leaves untimed, a fault or two past.
    # The truth holds the time the thread waited to run (a drill's scorer takes out the
    # waits it sees): beside a spinner on its CPU the storm's thread waits past its deadline
    # (cause_ns 10.85 ms of a 5 ms storm in a fresh-clone CI run on 2026-12-06).
    assert facts["pages"] > 0 and not facts["short"]
    assert 0 < facts["cause_ns"] <= stall_ns - facts["untimed_ns"] + off_cpu + 2_000_000
