"""Which libcuda entry points a PyTorch program really reaches, per PyTorch operation: counts
every call of every exported cu* function (one uprobe each, keyed by address in the kernel)
while a child process runs one operation at a time, and asks the driver
(cuGetProcAddress_v2) which address it hands out for the traced names, to tell exported
entry points from internal ones. Run on a GPU node as root with bcc importable:

    BCC_PROBE_LIMIT=4000 python3 tools/cuda_entrypoints.py --json entrypoints.json

The answer is in docs/gpu.md ("What PyTorch reaches").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpujitter.probes.cuda import FUNC_NAMES, mapped_libcuda, probe_address, system_libcuda
from gpujitter.probes.elf import ElfFile
from gpujitter.probes.host import HostPaths
from gpujitter.probes.procfs import read_maps

# The child: one PyTorch operation per phase, 10 repetitions each, then "done".
CHILD = r"""
import ctypes, json, sys, torch
x = torch.randn(1024, 1024, device="cuda")
torch.cuda.synchronize()
pinned = torch.ones(1024, 1024).pin_memory()
stream = torch.cuda.current_stream()
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
s.wait_stream(stream)
with torch.cuda.stream(s):
    y = x @ x
stream.wait_stream(s)
with torch.cuda.graph(g):
    gy = x @ x
torch.cuda.synchronize()

def proc_addresses():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuGetProcAddress_v2
    fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                   ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
    out = {}
    for name in sys.argv[1].split(","):
        for flags, label in ((0, "default"), (2, "per-thread")):
            p, status = ctypes.c_void_p(), ctypes.c_int()
            rc = fn(name.encode(), ctypes.byref(p), 13000, flags, ctypes.byref(status))
            out[f"{name}/{label}"] = {"rc": rc, "status": status.value, "addr": p.value or 0}
    return out

phases = {
    "launch (x @ x)": lambda: x @ x,
    "torch.cuda.synchronize()": lambda: torch.cuda.synchronize(),
    "stream.synchronize()": lambda: stream.synchronize(),
    "event.synchronize()": lambda: (lambda e: (e.record(), e.synchronize()))(torch.cuda.Event()),
    "tensor.item()": lambda: x.sum().item(),
    "tensor.cpu()": lambda: x.cpu(),
    "to(cuda) pageable": lambda: torch.ones(256, 1024).to("cuda"),
    "to(cuda) pinned non_blocking": lambda: pinned.to("cuda", non_blocking=True),
    "graph.replay()": lambda: g.replay(),
}
print(json.dumps({"ready": True, "proc": proc_addresses()}), flush=True)
for line in sys.stdin:
    name = line.strip()
    if name == "quit":
        break
    for _ in range(10):
        phases[name]()
    torch.cuda.synchronize()
    print(json.dumps({"done": name}), flush=True)
"""
PHASES = (
    "launch (x @ x)",
    "torch.cuda.synchronize()",
    "stream.synchronize()",
    "event.synchronize()",
    "tensor.item()",
    "tensor.cpu()",
    "to(cuda) pageable",
    "to(cuda) pinned non_blocking",
    "graph.replay()",
)
COUNTER = """
#include <uapi/linux/ptrace.h>
BPF_HASH(calls, u64, u64, 65536);
int count(struct pt_regs *ctx)
{
    if ((bpf_get_current_pid_tgid() >> 32) != TARGET)
        return 0;
    u64 ip = PT_REGS_IP(ctx);
    calls.increment(ip);
    return 0;
}
"""


def load_base(pid: int, path: str) -> int:
    """Where `path` is mapped in process `pid` (its mapping at file offset 0)."""
    real = Path(path).resolve()
    for m in read_maps(HostPaths(), pid):
        if m.path and Path(m.path).resolve() == real and m.offset == 0:
            return m.start
    raise SystemExit(f"{path} is not mapped in {pid}")


def main() -> int:
    from bcc import BPF

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, ",".join(sorted({n.split("_")[0] for n in FUNC_NAMES}))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    hello = json.loads(child.stdout.readline())
    # The libcuda PyTorch really loaded (a container or a compat folder may hold another).
    path = (mapped_libcuda(child.pid) or system_libcuda())[0]
    elf = ElfFile(path)
    functions = elf.exported_functions()
    names = sorted(n for n in functions if n.startswith("cu"))
    bpf = BPF(text=COUNTER.encode(), cflags=[f"-DTARGET={child.pid}"])
    by_addr: dict[int, str] = {}
    refused = []
    for name in names:
        addr = probe_address(elf, name)
        if addr is None or addr in by_addr:
            continue
        try:
            bpf.attach_uprobe(name=path, addr=addr, fn_name="count")
        except Exception:
            refused.append(name)
            continue
        by_addr[addr] = name
    base = load_base(child.pid, path)
    entry_of = {v: k for k, v in functions.items() if k.startswith("cu")}
    result: dict[str, Any] = {
        "libcuda": str(Path(path).resolve()),
        "exported_cu_functions": len(names),
        "probed": len(by_addr),
        "refused": refused,
        "phases": {},
        "cuGetProcAddress": {
            key: {
                **v,
                "exported_as": entry_of.get(v["addr"] - base, "internal") if v["addr"] else None,
            }
            for key, v in hello["proc"].items()
        },
    }
    table = bpf["calls"]
    for phase in PHASES:
        table.clear()
        child.stdin.write(phase + "\n")
        child.stdin.flush()
        json.loads(child.stdout.readline())
        counts = {}
        for k, v in table.items():
            vaddr = k.value - base
            counts[by_addr.get(vaddr, hex(vaddr))] = int(v.value)
        result["phases"][phase] = dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    child.stdin.write("quit\n")
    child.stdin.close()
    child.wait(timeout=60)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    for phase, counts in result["phases"].items():
        print(f"{phase}: " + ", ".join(f"{k}×{v}" for k, v in counts.items() if v >= 10))
    return 0


if __name__ == "__main__":
    sys.exit(main())
