"""Fixtures shared by every test package."""

from __future__ import annotations

import pytest
import trio.testing


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Trio's virtual clock that jumps ahead whenever every task is blocked.

    pytest-trio runs a test that requests it on this clock, so timeouts cost no wall time.
    """
    return trio.testing.MockClock(autojump_threshold=0)
