"""gpujitter: tells operators of GPU nodes why their GPUs sit idle.

Layers, dependencies pointing one way: gpujitter.probes (kernel and GPU evidence, typed
events) -> gpujitter.daemon (gap detection, attribution, sinks) -> gpujitter.tui; the
console script in gpujitter.cli sits on top of all three.
"""

__version__ = "0.1.0"
