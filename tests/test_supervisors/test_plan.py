"""The pure parts: restart-intensity window and the strategies' plans."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisors import (
    Restart,
    RestartPlan,
    add_restart,
    plan_one_for_all,
    plan_one_for_one,
    plan_rest_for_one,
    should_restart,
)


def test_intensity_allows_exactly_n_restarts_in_the_window() -> None:
    window: tuple[tuple[int, int], ...] = ()
    results = []
    for _ in range(3):
        ok, window = add_restart(window, 10, intensity=2, period=5)
        results.append(ok)
    assert results == [True, True, False]


def test_intensity_zero_gives_up_at_once() -> None:
    assert add_restart((), 0, intensity=0, period=5) == (False, ((0, 1),))


def test_window_is_inclusive_in_whole_seconds() -> None:
    assert add_restart(((5, 1),), 10, intensity=1, period=5) == (False, ((10, 1), (5, 1)))
    assert add_restart(((4, 1),), 10, intensity=1, period=5) == (True, ((10, 1),))
    assert add_restart(((10, 2),), 10, intensity=2, period=5) == (False, ((10, 3),))


@given(
    st.lists(st.integers(0, 30), max_size=20).map(sorted),
    st.integers(0, 5),
    st.integers(1, 6),
)
def test_window_matches_a_direct_count(stamps: list[int], intensity: int, period: int) -> None:
    window: tuple[tuple[int, int], ...] = ()
    for index, now in enumerate(stamps):
        ok, window = add_restart(window, now, intensity, period)
        assert all(now - period <= s <= now for s, _ in window)
        assert len(window) <= period + 1
        inside = [s for s in stamps[: index + 1] if s >= now - period]
        assert sum(count for _, count in window) == len(inside)
        assert ok == (len(inside) <= intensity)


def test_plans() -> None:
    order = ["a", "b", "c", "d"]
    assert plan_one_for_one(order, "b") == RestartPlan((), ("b",))
    assert plan_one_for_all(order, "b") == RestartPlan(("d", "c", "a"), ("a", "b", "c", "d"))
    assert plan_rest_for_one(order, "b") == RestartPlan(("d", "c"), ("b", "c", "d"))


def test_restart_table() -> None:
    assert should_restart(Restart.PERMANENT, "normal")
    assert not should_restart(Restart.TRANSIENT, "normal")
    assert not should_restart(Restart.TRANSIENT, "shutdown")
    assert should_restart(Restart.TRANSIENT, "killed")
    assert not should_restart(Restart.TEMPORARY, "boom")
