"""The pure parts of a supervisor: the restart-intensity window and one plan per strategy.

Mirrors ``supervisor:add_restart/3`` (OTP 25) and the shape of ``supervisor:restart/3``: which
children to stop (in reverse start order) and which to start (in start order) when one dies.
Nothing here touches a process; the restart engine in ``_restart.py`` carries the plans out.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import attrs

import otp

from ._spec import Restart, Strategy


def now_seconds(time: float) -> int:
    """Whole seconds of trio's clock, as OTP's ``erlang:monotonic_time(second)``."""
    return math.floor(time)


def add_restart(
    restarts: tuple[tuple[int, int], ...], now: int, intensity: int, period: int
) -> tuple[bool, tuple[tuple[int, int], ...]]:
    """Record a restart at second ``now``; return ``(allowed, new_window)``.

    OTP's ``add_restart``: restarts older than ``now - period`` are forgotten (the window is
    inclusive, in whole seconds), ``now`` is added, and the restart is allowed while the window
    holds at most ``intensity`` restarts. The window is ``((second, count), ...)``, newest
    first, so it never holds more than ``period + 1`` entries however many restarts it counts.
    """
    threshold = now - period
    kept = [entry for entry in restarts if entry[0] >= threshold]
    if kept and kept[0][0] == now:
        kept[0] = (now, kept[0][1] + 1)
    else:
        kept.insert(0, (now, 1))
    window = tuple(kept)
    return sum(count for _, count in window) <= intensity, window


def restarts_in_window(restarts: tuple[tuple[int, int], ...], now: int, period: int) -> int:
    """How many restarts of the window :func:`add_restart` keeps still count at second ``now``."""
    threshold = now - period
    return sum(count for second, count in restarts if second >= threshold)


@attrs.frozen
class RestartPlan:
    """What a strategy does when child ``failed`` must be restarted.

    ``terminate``: ids of *other* children to stop, in that order (reverse start order).
    ``start``: ids to (re)start, in that order (start order), the failed child included.
    """

    terminate: tuple[Hashable, ...]
    start: tuple[Hashable, ...]


def plan_one_for_one(order: Sequence[Hashable], failed: Hashable) -> RestartPlan:
    """one_for_one: restart only the child that died."""
    return RestartPlan(terminate=(), start=(failed,))


def plan_one_for_all(order: Sequence[Hashable], failed: Hashable) -> RestartPlan:
    """one_for_all: stop every other child (newest first), then start all in start order."""
    others = tuple(child for child in reversed(order) if child != failed)
    return RestartPlan(terminate=others, start=tuple(order))


def plan_rest_for_one(order: Sequence[Hashable], failed: Hashable) -> RestartPlan:
    """rest_for_one: stop the children started after the dead one (newest first), then start
    the dead one and those after it, in start order."""
    index = list(order).index(failed)
    rest = tuple(order[index:])
    return RestartPlan(terminate=tuple(reversed(rest[1:])), start=rest)


PLANS = {
    Strategy.ONE_FOR_ONE: plan_one_for_one,
    Strategy.ONE_FOR_ALL: plan_one_for_all,
    Strategy.REST_FOR_ONE: plan_rest_for_one,
    Strategy.SIMPLE_ONE_FOR_ONE: plan_one_for_one,
}


def is_normal_exit(reason: Any) -> bool:
    """``normal``, ``shutdown`` or ``{shutdown, _}``: exits a transient child is not restarted
    for."""
    return not otp.is_abnormal(reason)


def should_restart(restart: Restart, reason: Any) -> bool:
    """OTP's ``do_restart/3`` table: is a child with this restart type restarted after
    exiting with ``reason``?"""
    if restart is Restart.PERMANENT:
        return True
    if restart is Restart.TEMPORARY:
        return False
    return not is_normal_exit(reason)
