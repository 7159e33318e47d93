"""Drills: injected jitter, measured attribution accuracy (`gpujitter drill`, docs/accuracy.md).
A steady feeding loop (feeder.py) keeps a GPU busy, real or stubbed (stubcuda.c); a scenario
(scenarios.py, injectors.py) injects one known cause of jitter into its critical path at known
times; the real probes and the daemon's pipeline run beside it (runner.py) and the
attributions are scored against the truth (score.py)."""
