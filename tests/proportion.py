"""Whether sample counts follow given shares, for the tests of samplers that should sample
in proportion (python_stacks' budget: each thread's samples by its CPU time)."""

from __future__ import annotations

import math


def proportional_tail(counts: list[int], weights: list[int]) -> float:
    """How likely counts at least this far from shares in proportion to `weights` are, for
    counts drawn independently in those shares: Pearson's chi-square statistic against its
    distribution with len(counts) - 1 degrees of freedom. An even number of counts only
    (odd degrees of freedom: the tail has the closed form below, no table or scipy)."""
    if len(counts) % 2:
        raise ValueError(f"an even number of counts, not {len(counts)}")
    total, whole = sum(counts), sum(weights)
    expected = [total * w / whole for w in weights]
    x = sum((n - e) ** 2 / e for n, e in zip(counts, expected, strict=True))
    tail, term = math.erfc(math.sqrt(x / 2)), math.sqrt(2 * x / math.pi) * math.exp(-x / 2)
    for j in range(1, len(counts) // 2):
        tail += term
        term *= x / (2 * j + 1)
    return tail
