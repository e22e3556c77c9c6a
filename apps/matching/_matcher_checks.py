"""The checks of a stream's registration against the matching limits (``M_REGISTER``), for the
matcher: each refusal a :class:`StreamRejection` whose message names the limit and what to do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._dispatch import Capabilities, MatchingLimits, StreamRejection

__all__ = ["check_registration", "reject"]


def reject(code: str, message: str, *, permanent: bool) -> StreamRejection:
    return StreamRejection(code, message, permanent)


def check_registration(
    limits: MatchingLimits, worker_id: str, queue: Any, name: Any, caps: Any
) -> StreamRejection | None:
    if queue not in ("flow", "worker"):
        return reject(
            "bad_frame",
            f"M_REGISTER.queue must be 'flow' or 'worker' (got {queue!r})",
            permanent=True,
        )
    if not isinstance(name, str) or not name:
        return reject(
            "bad_frame", f"M_REGISTER.name must be a non-empty str (got {name!r})", permanent=True
        )
    if not isinstance(caps, Capabilities):
        return reject(
            "bad_frame", f"the worker's flows are not capabilities (got {caps!r})", permanent=True
        )
    if not worker_id or len(worker_id) > limits.max_queue_length:
        return reject(
            "limit",
            f"app worker id {worker_id[:64]!r} has {len(worker_id)} characters; it must have 1 to"
            f" matching.max_queue_length={limits.max_queue_length}: use a shorter worker id",
            permanent=True,
        )
    if queue == "worker" and name != worker_id:
        return reject(
            "bad_frame",
            f"a worker registers only its own app worker id queue ({worker_id!r}), not {name!r}",
            permanent=True,
        )
    flows: Mapping[str, Any] = caps.flows
    if len(flows) > limits.max_flow_types:
        return reject(
            "limit",
            f"the worker registers {len(flows)} flow types, the most matching.max_flow_types="
            f"{limits.max_flow_types} allows: register fewer flow types per worker",
            permanent=True,
        )
    # (the queue's own flow type first, then every one the worker advertises)
    for flow_type in [*([name] if queue == "flow" else []), *flows]:
        if len(flow_type) > limits.max_flow_type_length:
            return reject(
                "limit",
                f"flow type {flow_type[:64]!r}... has {len(flow_type)} characters, the most"
                f" matching.max_flow_type_length={limits.max_flow_type_length} allows: use a"
                " shorter flow type name",
                permanent=True,
            )
    return None
