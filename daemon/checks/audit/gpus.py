"""GPU settings: persistence mode (without it the driver tears the GPU state down when the
last client exits, and the next CUDA initialisation takes a second or two)."""

from __future__ import annotations

from collections.abc import Iterator

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.audit.irqs import owner_uid, pids_named
from gpujitter.daemon.checks.audit.model import AuditContext, Finding, Reading, rule
from gpujitter.probes.host import decimal

# nvidia-persistenced runs as root or as a system account of its own (Debian's
# nvidia-persistenced user). One owned by a login user is anyone's process named so (a name
# is each process's own choice), not the driver's daemon.
SYSTEM_UID_MAX = 999


def _system_account(uid: str) -> bool:
    number = decimal(uid)
    return number is not None and number <= SYSTEM_UID_MAX


@rule("gpu.persistence")
def persistence(ctx: AuditContext) -> Iterator[Finding]:
    gpus = ctx.topology.gpus
    if not gpus:
        yield Finding(
            "gpu.persistence",
            "info",
            "GPUs",
            f"no NVIDIA GPU found ({ctx.topology.gpu_source})",
            (Reading(str(ctx.paths.sys / "bus/pci/devices"), "no NVIDIA display/3D device"),),
        )
        return
    owners = {pid: owner_uid(ctx, pid) for pid in pids_named(ctx, "nvidia-persistenced")}
    daemon = next(((pid, uid) for pid, uid in owners.items() if _system_account(uid)), None)
    for g in gpus:
        subject = f"GPU {g.bus_id}" if g.index is None else f"GPU {g.index} ({g.bus_id})"
        if g.persistence_mode is True:
            yield Finding(
                "gpu.persistence",
                "ok",
                subject,
                "persistence mode on",
                (Reading("NVML nvmlDeviceGetPersistenceMode", "enabled"),),
            )
        elif g.persistence_mode is False:
            yield Finding(
                "gpu.persistence",
                "warn",
                subject,
                "persistence mode off: when no process holds the GPU the driver unloads its "
                "state, and the next CUDA start takes a second or two",
                (Reading("NVML nvmlDeviceGetPersistenceMode", "disabled"),),
                remedies.gpu_persistence(g.index if g.index is not None else g.bus_id),
            )
        elif daemon is not None:
            pid, uid = daemon
            yield Finding(
                "gpu.persistence",
                "ok",
                subject,
                f"nvidia-persistenced is running (pid {pid})",
                (
                    Reading(str(ctx.paths.proc / str(pid) / "comm"), "nvidia-persistenced"),
                    Reading(
                        str(ctx.paths.proc / str(pid) / "status"), f"Uid: {uid} (a system account)"
                    ),
                ),
            )
        else:
            yield Finding(
                "gpu.persistence",
                "info",
                subject,
                "persistence mode unknown without NVML, and nvidia-persistenced is not running",
                (
                    Reading(
                        str(ctx.paths.proc / "*/comm"), "no nvidia-persistenced of a system account"
                    ),
                ),
                remedies.gpu_persistence(g.bus_id),
            )
