"""What the engine does with a call for a running flow another server holds (its pending
step's lease is that server's): part B of MULTISERVER.md forwards it there. Until then the
caller gets a retryable ``unavailable`` naming that server; one function, so forwarding
replaces it alone.
"""

from __future__ import annotations

from typing import Any

import otp

from ._engine_state import _err, _State
from ._errors import Unavailable

__all__ = ["forward"]


def forward(
    state: _State, from_: otp.From, request: tuple[Any, ...], flow_id: str, owner: str | None
) -> None:
    """Answer ``from_``'s ``request`` (``("result", flow_id, timeout)``, ``("call_rpc", ...)``,
    ``("cancel", flow_id)``) for flow ``flow_id``, which server ``owner`` holds (None: it moved
    while this engine looked it up)."""
    me = state.options.server_id
    where = "another matching server" if owner is None else f"matching server {owner!r}"
    exc = Unavailable(
        f"flow {flow_id!r} is run by {where}, not by this one ({me!r}): call that server,"
        " or retry here (its flows move to this server when it stops)",
        details={"flow_id": flow_id, "owner": owner},
    )
    otp.reply(from_, _err(exc))
