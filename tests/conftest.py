"""Shared test settings. Kernel tests need root, bcc and tracefs: CI runs as root, so a
missing prerequisite fails those tests loudly instead of skipping them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpujitter.daemon.analysis.records import Attribution
from tests.descriptors import (  # noqa: F401 (the descriptor guard: every test, every run)
    descriptors_kept,
    pytest_runtest_call,
    pytest_runtestloop,
)

FIXTURES = Path(__file__).with_name("fixtures")


def cause_ns(attr: Attribution, cause: str) -> int:
    """The time an attribution gives one cause (0 when it has no part of that cause)."""
    return sum(p.ns for p in attr.parts if p.cause == cause)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
