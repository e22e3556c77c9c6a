"""``info/2``: one item of what ``info/1`` reports, by OTP's item name (or the
:class:`~otp.ets.TableInfo` field's), plus the fixation items only ``info/2`` has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._errors import EtsError, brief
from ._fixtable import fix_info
from ._table import Tab

ITEMS: dict[str, Callable[[Tab], Any]] = {
    "id": lambda tab: tab.handle,
    "name": lambda tab: tab.name,
    "named_table": lambda tab: tab.named,
    "named": lambda tab: tab.named,
    "type": lambda tab: tab.kind,
    "protection": lambda tab: tab.access,
    "access": lambda tab: tab.access,
    "owner": lambda tab: tab.owner,
    "heir": lambda tab: tab.heir,
    "keypos": lambda tab: tab.kp,
    "size": lambda tab: tab.size(),
    "memory": lambda tab: tab.memory(),
    "node": lambda tab: tab.node.name,
    "expire_after": lambda tab: tab.default_ttl,
    "read_concurrency": lambda tab: tab.hints.read_concurrency,
    "write_concurrency": lambda tab: tab.hints.write_concurrency,
    "compressed": lambda tab: tab.hints.compressed,
    "decentralized_counters": lambda tab: tab.hints.decentralized(tab.ordered),
    "fixed": lambda tab: tab.fix is not None,
    "safe_fixed": lambda tab: fix_info(tab, monotonic=False),
    "safe_fixed_monotonic_time": lambda tab: fix_info(tab, monotonic=True),
}

#: OTP's items that describe its VM's memory, with no counterpart here.
_VM_ONLY = ("binary", "stats")


def check_item(item: Any) -> Callable[[Tab], Any]:
    """The function computing ``item``.

    Raises:
        EtsError: ``item`` is not an item (OTP's badarg), or one of OTP's VM internals.
    """
    try:
        return ITEMS[item]
    except (KeyError, TypeError):
        pass
    why = (
        "it describes OTP's VM memory and has no counterpart here"
        if item in _VM_ONLY
        else f"the items are {', '.join(ITEMS)}"
    )
    raise EtsError(f"ets.info: {brief(item)} is not an info item: {why}", operation="info")
