"""gpujitter.daemon: GPU gap detection, attribution, node audit, trace files and the sinks
(JSON-lines log, trace recorder, unix-socket stream). Knows nothing of the TUI."""
