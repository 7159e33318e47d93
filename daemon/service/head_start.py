"""`gpujitter run`'s head start: the probes' compile (seconds of clang and LLVM, without the
GIL) begun on a thread of its own as soon as the settings are read, so that importing and
building the daemon overlap it; NVML's session waits for its end (settle_compile), off its
peak (docs/performance.md, "Start and stop").
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from gpujitter.daemon.service.config import Config, check_node, probe_names, thresholds_by_probe
from gpujitter.probes.base import trim_heap
from gpujitter.probes.bundle import finish_ahead
from gpujitter.probes.runner import compile_ahead
from gpujitter.probes.topology import cpu_topology


def start_compile(config: Config) -> None:
    """Check what the settings name on this node (a mistake is one line, at once, and no
    compile is started), then start compiling the module the daemon's probe set will ask
    for (probes/runner.py compile_ahead: the set takes it only where its inputs are the
    same; what fails is reported by the set's own start, as without this)."""
    check_node(config, starting=True)
    topology = cpu_topology(override=config["topology.override"] or None)
    with _batch():
        compile_ahead(probe_names(config), topology=topology,
                      thresholds=thresholds_by_probe(config["probes.thresholds"]))  # fmt: skip


def settle_compile() -> None:
    """Wait for the compile started ahead, then hand back the heap LLVM freed (~40 MB that
    glibc keeps): what the start allocates from here on, NVML's session above all (18 MB,
    live from nvmlInit to the exit), adds to what the compile leaves, not to its peak. The
    main thread had little else to do by then: the daemon is built in ~15 ms, and the
    probes' start waits for the compile anyway (docs/performance.md, "Start and stop").
    No compile pending: nothing to do."""
    if finish_ahead():
        trim_heap()


@contextlib.contextmanager
def _batch() -> Iterator[None]:
    """The calling thread SCHED_BATCH for the block, so that a thread started in it inherits
    it: the daemon's start runs so (never preempting a waking watched thread,
    daemon/service/own_scheduling.py), but the runtime sets it only later. The caller gets
    its policy back (`run` called in a longer process, a test's). Refused: as it was."""
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError:
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, policy, param)
