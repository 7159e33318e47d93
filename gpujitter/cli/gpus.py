"""`gpujitter gpus`: the node's NVIDIA GPUs with what feeding them depends on: NUMA node and
local CPUs, current utilisation and power, and the processes computing on each."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from gpujitter.cli.command import Command
from gpujitter.cli.options import path_arg
from gpujitter.cli.output import print_json, table
from gpujitter.probes.host import HostPaths, format_cpulist, read_name
from gpujitter.probes.topology import pci_device
from gpujitter.text import printable


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_nvml_source_args(p)


def add_nvml_source_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("NVML backend")
    g.add_argument(
        "--nvml-replay",
        type=path_arg,
        metavar="FILE",
        help="answer from an NVML recording instead of the driver (tests, bug reports)",
    )
    g.add_argument(
        "--nvml-record",
        type=path_arg,
        metavar="FILE",
        help="record every NVML call of this run to FILE (a fixture or a bug report)",
    )


def nvml_backend(args: argparse.Namespace) -> Any:
    """The backend chosen by --nvml-replay/--nvml-record: None means pynvml itself."""
    from gpujitter.errors import GpujitterError
    from gpujitter.files import can_create
    from gpujitter.probes.nvml_session import NvmlPlayback, NvmlTap

    if getattr(args, "no_nvml", False) and (args.nvml_replay or args.nvml_record):
        raise GpujitterError("--no-nvml with --nvml-replay or --nvml-record: NVML is not "
                             "used; give one of them")  # fmt: skip
    if args.nvml_replay is not None and args.nvml_record is not None:
        raise GpujitterError("--nvml-record with --nvml-replay: a session played back is not "
                             "recorded again; give one of them")  # fmt: skip
    if args.nvml_replay is not None:
        try:
            return NvmlPlayback(args.nvml_replay)
        except OSError as err:
            raise GpujitterError(f"--nvml-replay {args.nvml_replay}: {err.strerror}") from None
        except ValueError as err:
            raise GpujitterError(f"--nvml-replay {args.nvml_replay}: {err}") from None
    if args.nvml_record is not None:
        # said before the work, not after it when the recording is written; never over a
        # file already there (a trace given by mistake)
        can_create(Path(args.nvml_record), "--nvml-record")
        return NvmlTap()
    return None


def save_recording(args: argparse.Namespace, backend: Any) -> None:
    from gpujitter.errors import GpujitterError
    from gpujitter.probes.nvml_session import NvmlTap

    if isinstance(backend, NvmlTap):
        try:
            backend.save(args.nvml_record, command=f"gpujitter {args.command}", new=True)
        except OSError as err:
            raise GpujitterError(f"--nvml-record {args.nvml_record}: {err.strerror}") from None


def describe_gpus(nvml: Any, paths: HostPaths) -> list[dict[str, Any]]:
    """One dict per GPU: identity, NUMA placement (NVML's, else sysfs's), readings,
    processes, and what NVML could not tell."""
    out = []
    cpu_count = os.cpu_count() or 1
    for index in range(nvml.device_count()):
        info = nvml.gpu_info(index, cpu_count)
        if info is None:
            out.append({"index": index, "problems": [nvml.why_not(index, "handle")]})
            continue
        pci = pci_device(paths.sys / "bus/pci/devices" / info.pci_bus_id)
        node = info.numa_node if info.numa_node is not None else pci.numa_node
        cpus = list(info.local_cpus) or list(pci.local_cpus)
        procs = nvml.compute_processes(index)
        out.append(
            {
                "index": index,
                "name": info.name,
                "uuid": info.uuid,
                "pci_bus_id": info.pci_bus_id,
                "numa_node": node,
                "local_cpus": format_cpulist(cpus),
                "persistence_mode": info.persistence_mode,
                "util_percent": nvml.utilization_percent(index),
                "power_w": nvml.power_watts(index),
                "processes": [
                    {
                        "pid": p.pid,
                        "comm": read_name(paths.proc / str(p.pid) / "comm") or "",
                        "used_bytes": p.used_bytes,
                    }
                    for p in procs or []
                ],
                "problems": [
                    f"{fn}: {why}"
                    for (gpu, fn), why in sorted(nvml.problems.items())
                    if gpu == index
                ]
                + ([nvml.lost[index]] if index in nvml.lost else []),
            }
        )
    return out


def run(args: argparse.Namespace) -> int:
    from gpujitter.errors import GpujitterError
    from gpujitter.probes.nvml import NvmlUnavailable, open_nvml
    from gpujitter.probes.nvml_session import NvmlPlaybackMissing

    backend = nvml_backend(args)
    # What a recording played back can get wrong: the calls these make were not recorded
    # (one made by another command, the daemon's sampler or `record`, holds others), or
    # the answers recorded are not what NVML gives (a damaged or hand-made file).
    played_wrong = (
        (NvmlPlaybackMissing, TypeError, ValueError, AttributeError, LookupError, OSError)
        if args.nvml_replay is not None
        else ()
    )
    try:
        try:
            nvml = open_nvml(backend)
        except NvmlUnavailable as err:
            save_recording(args, backend)
            if args.json:
                print_json({"gpus": [], "reason": str(err)})
            else:
                print(f"no NVIDIA GPU usable: {printable(str(err))}")
            return 0
        with nvml:
            gpus = describe_gpus(nvml, HostPaths())
            driver = nvml.driver_version()
    except played_wrong as err:
        why = (f"{err}: it was not recorded by `gpujitter gpus --nvml-record`"
               if isinstance(err, NvmlPlaybackMissing)
               else f"not an NVML session's answers ({type(err).__name__}: {err})")  # fmt: skip
        raise GpujitterError(f"--nvml-replay {args.nvml_replay}: {why}") from None
    save_recording(args, backend)
    if args.json:
        print_json({"driver": driver, "gpus": gpus})
        return 0
    if not gpus:
        print(f"no NVIDIA GPU: NVML (driver {driver}) sees none")
        return 0
    print(
        table(
            ["GPU", "NAME", "PCI", "NODE", "CPUS", "UTIL", "POWER", "PROCESSES"],
            [
                (
                    g["index"],
                    g.get("name", "?"),
                    g.get("pci_bus_id", "?"),
                    "?" if g.get("numa_node") is None else g["numa_node"],
                    g.get("local_cpus") or "?",
                    "?" if g.get("util_percent") is None else f"{g['util_percent']}%",
                    "?" if g.get("power_w") is None else f"{g['power_w']:.0f}W",
                    " ".join(f"{p['pid']}/{p['comm']}" for p in g.get("processes", [])) or "-",
                )
                for g in gpus
            ],
        )
    )
    for g in gpus:
        for problem in g["problems"]:
            print(printable(f"GPU {g['index']}: {problem}"))
    return 0


COMMAND = Command(
    name="gpus",
    summary="list the GPUs: NUMA node, local CPUs, utilisation, power, processes",
    description="""
        Show each NVIDIA GPU of this node with its PCI address, NUMA node and the CPUs local
        to it (NVML's answer, else sysfs's), its current utilisation and board power, and
        the processes computing on it. Readings NVML cannot give are shown as '?' and the
        reason is listed below the table. On a node without a usable GPU it says so in one
        line and exits 0.
    """,
    examples="""
        # the GPUs of this node
        gpujitter gpus
        # as JSON, for scripts
        gpujitter gpus --json
        # what a recorded NVML session (e.g. from a bug report) showed
        gpujitter gpus --nvml-replay h200.jsonl
    """,
    add_arguments=add_arguments,
    run=run,
)
