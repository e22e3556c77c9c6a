"""The flow definitions the engine knows by flow type, for ``start_known`` (a client without
the flow type's Registry, such as ``python -m apps.matching start``): the newest one it was
given, by a client's ``start_flow`` or a worker's ``define_flows``, else the one the newest
stored flow of the type was pinned with (read from the store by a helper process).
"""

from __future__ import annotations

from typing import Any

import attrs

import otp

from ._errors import MatchingError, UnknownFlowType
from ._flow_spec import FlowSpec
from ._store import StoreError, StoreServer

__all__ = [
    "MAX_KNOWN",
    "Advertised",
    "DefinitionLoaded",
    "KnownRequest",
    "load_definition",
    "remember",
    "unknown_definition",
]

#: Flow types whose definition the engine keeps in memory (the least recently given go first:
#: app worker ids and flow types come from peers, so the map must not only grow).
MAX_KNOWN = 4096


@attrs.frozen
class Advertised:
    """connection -> engine (a cast): the definitions a worker's ``define_flows`` sent."""

    definitions: dict[str, FlowSpec]


@attrs.frozen(eq=False)
class KnownRequest:
    """A ``start_known`` call waiting for the store's newest definition of its flow type."""

    from_: otp.From
    flow_type: str
    args: list[Any]
    flow_id: str | None


@attrs.frozen(eq=False)
class DefinitionLoaded:
    """helper -> engine: the newest stored flow's definition of ``request.flow_type`` (None if
    no flow of it is stored), or the error reading it."""

    request: KnownRequest
    definition: Any
    error: MatchingError | None = None


def remember(state: Any, flow_type: str, spec: FlowSpec) -> None:
    """``spec`` is now the newest definition known of ``flow_type``."""
    known: dict[str, FlowSpec] = state.known
    known.pop(flow_type, None)
    known[flow_type] = spec
    while len(known) > MAX_KNOWN:
        del known[next(iter(known))]


def unknown_definition(flow_type: str) -> UnknownFlowType:
    return UnknownFlowType(
        f"the server knows no definition of flow type {flow_type!r}: no worker advertised one"
        " and no flow of it is stored; start a worker that registers it (or start one flow of"
        " it from an SDK client whose Registry has it), then retry",
        details={"flow_type": flow_type},
    )


async def load_definition(store: Any, request: KnownRequest, engine: otp.Pid) -> None:
    """Read the definition the newest stored flow of ``request.flow_type`` was pinned with and
    send it to ``engine`` (a linked helper: it never raises for the store's errors)."""
    try:
        records = await StoreServer.list_flows(
            flow_type=request.flow_type, limit=1, server=store, timeout=None
        )
    except StoreError as exc:
        otp.send(engine, DefinitionLoaded(request, None, exc))
        return
    otp.send(engine, DefinitionLoaded(request, records[0].definition if records else None))
