"""Shared test settings. Kernel tests need root, bcc and tracefs: CI runs as root, so a
missing prerequisite fails those tests loudly instead of skipping them."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).with_name("fixtures")


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES
