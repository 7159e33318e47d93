"""gpujitter.daemon.service: the runtime every event-consuming command runs (queue, signals,
clock tick, node state, its own threads' scheduling, systemd notify) and `gpujitter run`'s
daemon with its configuration and the GPU idle floors it keeps across restarts."""
