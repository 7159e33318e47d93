"""gpujitter.probes: the evidence layer. eBPF probes (one module and one .bpf.c per jitter
source), NVML and libcuda tracing, the host's topology; typed events out. Knows nothing of
the daemon or the TUI."""
