"""Benchmarks (`python -m bench` lists them). A bench started with GJ_BENCH_TREE=DIR in its
environment imports the gpujitter package laid out in DIR (another tree: the rounds of a
bench's --before) instead of this checkout's."""

import os
import sys

if _tree := os.environ.get("GJ_BENCH_TREE"):
    # Ahead of an editable install's finder, which would otherwise win over the path.
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
    sys.path.insert(0, _tree)
