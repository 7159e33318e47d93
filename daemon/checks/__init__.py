"""gpujitter.daemon.checks: the node checks: `gpujitter doctor` (can profiling run here) and
`gpujitter audit` (is the node tuned for GPU work), one module per family of checks."""
