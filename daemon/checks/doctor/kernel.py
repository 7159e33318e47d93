"""Doctor checks of the kernel and its toolchain: BPF ring buffers, BTF, tracefs, bcc, and
headers bcc can compile against."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from gpujitter.daemon.analysis import remedies
from gpujitter.daemon.checks.doctor.model import DoctorEnv, Result, check
from gpujitter.probes.host import read_text

RINGBUF_KERNEL = (5, 8)  # BPF ring buffers, which every probe streams through


@check
def check_kernel(env: DoctorEnv) -> Iterator[Result]:
    release = env.release
    need = ".".join(map(str, RINGBUF_KERNEL))
    if env.kernel_version >= RINGBUF_KERNEL:
        yield Result("kernel", "pass", f"{release} (BPF ring buffer needs >= {need})")
    else:
        yield Result(
            "kernel",
            "fail",
            f"{release}: the probes stream through BPF ring buffers, which need >= {need}",
            fix=f"boot a kernel >= {need}",
        )


@check
def check_btf(env: DoctorEnv) -> Iterator[Result]:
    btf = env.paths.sys / "kernel/btf/vmlinux"
    if btf.exists():
        size = btf.stat().st_size
        yield Result("btf", "pass", f"kernel BTF present ({size // 1024} KiB)", source=str(btf))
    else:
        yield Result(
            "btf",
            "warn",
            "no kernel BTF: probes still run (tracepoint layouts come from tracefs), but bcc "
            "cannot check kernel types against this kernel",
            fix="boot a kernel built with CONFIG_DEBUG_INFO_BTF=y",
            source=str(btf),
        )


@check
def check_tracefs(env: DoctorEnv) -> Iterator[Result]:
    mounts = read_text(env.paths.proc / "mounts") or ""
    points = [line.split()[1] for line in mounts.splitlines() if line.split()[:1] == ["tracefs"]]
    if "/sys/kernel/tracing" in points and (env.paths.tracefs / "events").is_dir():
        yield Result(
            "tracefs",
            "pass",
            "mounted at /sys/kernel/tracing",
            source=str(env.paths.proc / "mounts"),
        )
    else:
        where = f" (mounted only at {', '.join(points)})" if points else ""
        yield Result(
            "tracefs",
            "fail",
            f"tracefs not mounted at /sys/kernel/tracing{where}: no tracepoint can attach",
            fix=remedies.mount_tracefs(),
            source=str(env.paths.proc / "mounts"),
        )


@check
def check_bcc(env: DoctorEnv) -> Iterator[Result]:
    try:
        import bcc
    except Exception as err:  # ImportError, or OSError when libbcc.so itself will not load
        yield Result(
            "bcc",
            "fail",
            f"cannot import bcc: {err}",
            fix=remedies.install_bcc(),
        )
        return
    version = getattr(bcc, "__version__", "unknown version")
    yield Result("bcc", "pass", f"bcc {version} ({Path(bcc.__file__).parent})")


@check
def check_headers(env: DoctorEnv) -> Iterator[Result]:
    release = env.release
    moddir = env.paths.modules / release
    build, source = moddir / "build", moddir / "source"
    have = (build / "Makefile").exists()
    uts = _headers_release(build) if have else None
    if not have:
        candidates = sorted(env.paths.src.glob("linux-headers-*-amd64"))
        if candidates:
            base = str(candidates[-1])
            fix = remedies.link_headers(release, base, base.removesuffix("-amd64") + "-common")
        else:
            fix = remedies.install_headers(release)
        yield Result(
            "headers",
            "fail",
            f"no kernel headers at {build}: bcc cannot compile any probe",
            fix=fix,
            source=str(build),
        )
    elif not (source.exists() or (build / "include/linux").is_dir()):
        yield Result(
            "headers",
            "fail",
            f"{build} is there but {source} is missing (Debian splits headers in two)",
            fix=remedies.link_headers(
                release,
                os.path.realpath(build),
                os.path.realpath(build).removesuffix("-amd64") + "-common",
            ),
            source=str(source),
        )
    elif uts == release:
        yield Result("headers", "pass", f"matching headers for {release}", source=str(build))
    else:
        yield Result(
            "headers",
            "warn",
            f"fallback headers {uts or 'of unknown version'} linked for {release}: "
            "tracepoints, uprobes and perf events compile and run (tracepoint layouts come from "
            "tracefs); kernel struct layouts from these headers are another kernel's and "
            "must never be read",
            fix=remedies.install_headers(release) + "  # when a matching package exists",
            source=os.path.realpath(build),
        )


def _headers_release(build: Path) -> str | None:
    text = read_text(build / "include/generated/utsrelease.h") or ""
    match = re.search(r'UTS_RELEASE\s+"([^"]+)"', text)
    return match.group(1) if match else read_text(build / "include/config/kernel.release")
