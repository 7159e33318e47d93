"""`gpujitter run`: the daemon (daemon/service/service.py), configured from a TOML file, GPUJITTER_*
environment variables and these flags (flags win)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gpujitter.cli.command import Command
from gpujitter.cli.options import add_threshold_arg, add_watch_args, duration_arg_ns, path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        type=path_arg,
        metavar="FILE",
        help="TOML configuration (default /etc/gpujitter/gpujitter.toml if present)",
    )
    p.add_argument("--log", metavar="PATH", help="attribution log, JSON lines ('' for none)")
    p.add_argument(
        "--record",
        metavar="PATH",
        help="also record the raw event stream as trace files in PATH ('' for none)",
    )
    p.add_argument("--socket", metavar="PATH", help="stream socket ('' for none)")
    p.add_argument(
        "--metrics", metavar="HOST:PORT", help="serve Prometheus metrics there ('' for none)"
    )
    p.add_argument(
        "--probes",
        metavar="LIST",
        help="probes to run, comma-separated; +NAME adds one to the default set "
        "(--probes sched,irq runs those two)",
    )
    p.add_argument("--disable", metavar="LIST", help="probes not to run, comma-separated")
    add_threshold_arg(p)
    p.add_argument(
        "--no-gpu-processes",
        action="store_true",
        help="do not watch every process NVML lists on a GPU",
    )
    p.add_argument(
        "--topology-override",
        metavar="FILE",
        help="TOML file assigning CPUs to emulated NUMA nodes (docs/topology.md)",
    )
    p.add_argument(
        "--min-gap",
        metavar="TIME",
        help="report GPU idle stretches of at least TIME (default 5ms, a bare number is in ms; "
        "gaps.min_gap)",
    )
    p.add_argument(
        "-d", "--duration", metavar="TIME", help="stop after TIME (default: run until stopped)"
    )
    p.add_argument("--no-nvml", action="store_true", help="do not use NVML (host evidence only)")
    p.add_argument("--quiet", action="store_true", help="do not print attributions")
    p.add_argument(
        "--print-config",
        action="store_true",
        help="print the configuration in force (and where each value came from), then exit",
    )
    add_watch_args(p)  # fmt: skip


def flags_of(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """Command-line values as configuration keys, with the flag that gave each (errors name
    it); a value None was not given, the file or the environment decide."""
    return {
        "log.path": ("--log", args.log),
        "record.path": ("--record", args.record),
        "socket.path": ("--socket", args.socket),
        "metrics.listen": ("--metrics", args.metrics),
        "probes.enable": ("--probes", args.probes),
        "probes.disable": ("--disable", args.disable),
        "probes.thresholds": ("--threshold", list(args.threshold) or None),
        "watch.pids": ("--pid", [str(p) for p in args.pid] or None),
        "watch.comms": ("--comm", list(args.comm) or None),
        "watch.cgroups": ("--cgroup", [str(c) for c in args.cgroup] or None),
        "watch.pods": ("--pod", list(args.pod) or None),
        "watch.slurm_jobs": ("--slurm-job", list(args.slurm_job) or None),
        "watch.gpu_processes": ("--no-gpu-processes", False if args.no_gpu_processes else None),
        "topology.override": ("--topology-override", args.topology_override),
        "gaps.min_gap": ("--min-gap", args.min_gap),
    }


def run(args: argparse.Namespace) -> int:
    from gpujitter.cli.output import print_json, table
    from gpujitter.daemon.service.config import check_node, load_config, probe_names

    config = load_config(args.config, flags=flags_of(args))
    duration_ns = duration_arg_ns(args)
    if args.print_config:
        check_node(config, starting=False)
        probe_names(config)  # the names are known probes
        rows = config.explain()
        if args.json:
            print_json({key: {"value": value, "source": src} for key, value, src in rows})
        else:
            print(table(["SETTING", "VALUE", "FROM"], rows))
        return 0
    from gpujitter.daemon.service.head_start import start_compile

    # Before the daemon's imports (~0.4 s), which the compile then overlaps.
    start_compile(config)
    from gpujitter.daemon.service.service import Console, Daemon

    console = Console(sys.stdout, args.json, quiet=args.quiet)
    daemon = Daemon(config, console=console, nvml=not args.no_nvml, duration_ns=duration_ns)
    return daemon.run()


COMMAND = Command(
    name="run",
    summary="the daemon: probes, GPU side and attribution; log, socket, metrics",
    description="""
        Run the probes, the libcuda tracer and the NVML sampler, detect GPU idle gaps and
        attribute each one to its causes. Attributions are printed (one line each, or
        NDJSON with --json), appended to the JSON-lines log, and streamed on the unix
        socket with per-CPU and per-probe status (what `gpujitter top` shows); --record
        also keeps the raw event stream as trace files, for `gpujitter report`. Settings
        come from /etc/gpujitter/gpujitter.toml (or --config), then GPUJITTER_* variables,
        then these flags. Under systemd it speaks sd_notify (READY once the probes are
        attached, WATCHDOG), SIGTERM stops it cleanly and SIGHUP (or SIGUSR1) reopens the log.
    """,
    examples="""
        # the daemon in the foreground, watching every GPU process NVML lists
        gpujitter run
        # one training job, its raw events recorded for a post-mortem
        gpujitter run --pid 4121 --record /var/lib/gpujitter/traces --log /tmp/attr.jsonl
        # what the configuration resolves to, and where each value came from
        gpujitter run --print-config
        # the processes of one Kubernetes pod and of one Slurm job on this node
        gpujitter run --pod ml/trainer-0 --slurm-job 1234
        # metrics for Prometheus on localhost
        gpujitter run --metrics 127.0.0.1:9464
    """,
    add_arguments=add_arguments,
    run=run,
)
