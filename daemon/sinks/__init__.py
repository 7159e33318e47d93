"""gpujitter.daemon.sinks: where events and findings go: the trace file and its capture, the
JSON-lines log, the unix-socket stream, Prometheus metrics, and the rotation and disk-full
policy the file sinks share; adapters.py fits each to the runtime's Sink."""
