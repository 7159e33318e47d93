"""Drills: injected jitter, measured attribution accuracy (`gpujitter drill`, docs/accuracy.md).
A steady feeding loop (feeder.py) keeps a GPU busy, real or stubbed (stubcuda.c); a scenario
(scenarios.py, injectors.py) injects one known jitter source into its critical path at known
times; the real evidence sources and the daemon's pipeline run beside it (runner.py) and the
attributions are scored against the truth (score.py)."""
