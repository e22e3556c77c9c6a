"""State patches: what a Step or an RPC changed in a flow's state, as ``{"set": {..},
"delete": [..]}`` (so a Step and an RPC that touch different keys never undo each other)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

__all__ = ["apply_patch", "copy_state", "state_patch"]


def state_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """What a handler changed: ``{"set": {key: value}, "delete": [key]}`` (keys compared by
    value, so an untouched key is not sent back)."""
    changed = {k: v for k, v in after.items() if k not in before or before[k] != v}
    deleted = [k for k in before if k not in after]
    return {"set": changed, "delete": deleted}


def apply_patch(state: Mapping[str, Any], patch: Mapping[str, Any] | None) -> dict[str, Any]:
    """``state`` with ``patch`` (from :func:`state_patch`) applied; ``state`` is unchanged.

    Raises:
        ValueError: ``patch`` is not of the shape :func:`state_patch` builds.
    """
    result = dict(state)
    if not patch:
        return result
    sets = patch.get("set", {})
    deletes = patch.get("delete", [])
    if not isinstance(sets, Mapping) or not isinstance(deletes, list | tuple):
        raise ValueError(f"a state patch is {{'set': dict, 'delete': list}} (got {patch!r})")
    for key in deletes:
        result.pop(key, None)
    result.update(sets)
    return result


def copy_state(state: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of a state, so a handler's in-place changes show up in its patch."""
    return copy.deepcopy(dict(state))
