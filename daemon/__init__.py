"""gpujitter.daemon: one package per wing: analysis (gaps, attribution), sinks (trace, log,
stream, metrics), service (the runtime and the daemon), offline (reading recordings), checks
(doctor, audit) and drill (measured accuracy). Knows nothing of the TUI."""
