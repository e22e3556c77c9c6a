"""Fixtures shared by every test package."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import trio.testing


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    """Trio's virtual clock that jumps ahead whenever every task is blocked.

    pytest-trio runs a test that requests it on this clock, so timeouts cost no wall time.
    """
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.fixture(autouse=True)
def _progress_logger_level_put_back() -> Iterator[None]:
    """``otp.node.configure_logging`` sets the level of the supervisors' progress logger, a
    process-wide setting (a node started in-process, or a benchmark, leaves it): each test
    starts with the level it found, so no test depends on which ran before it."""
    progress = logging.getLogger("supervisors.progress")
    level = progress.level
    yield
    progress.setLevel(level)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first: the matching chaos runs take tens of seconds each, and with the
    suite spread over xdist workers (pyproject's ``-n``), one started last would keep a run
    going while the other workers idle. The order is otherwise kept."""
    items.sort(key=lambda item: item.get_closest_marker("chaos") is None)
