"""A flow type's definition as the engine pins it when a flow starts: ``FlowSpec`` (its steps
with their kinds, retry policies and timeouts, a SubFlow step's child definition, its RPC names)
and ``parse_definition``, which validates what a client sent (as a Temporal server pins a
workflow's history to its first version).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from ._errors import ConfigurationError, LimitError
from ._model import MAX_NAME_LENGTH, STEP_KINDS, RetryPolicy

__all__ = ["MAX_DEPTH", "FlowSpec", "StepSpec", "parse_definition", "parse_definitions"]

#: How deep SubFlow definitions may nest in one definition (a recursive flow type leaves its
#: own definition out, so this bounds hostile input, not flows).
MAX_DEPTH = 8


@attrs.frozen
class StepSpec:
    """One step of a pinned flow definition: its name, retry policy and attempt timeout, its
    kind (``execute``, ``wait_for``, ``subflow``) and, for a SubFlow, the child's flow type
    and the definition it carried (None: the one the server knows for that type)."""

    name: str
    retry: RetryPolicy
    timeout: float | None
    kind: str = "execute"
    child_type: str | None = None
    child: FlowSpec | None = None

    def to_wire(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "max_attempts": self.retry.max_attempts,
            "initial_backoff": self.retry.initial_backoff,
            "backoff_coefficient": self.retry.backoff_coefficient,
            "max_backoff": self.retry.max_backoff,
            "non_retryable_errors": list(self.retry.non_retryable_errors),
            "timeout": self.timeout,
        }
        if self.child_type is not None:
            entry["flow_type"] = self.child_type
        if self.child is not None:
            entry["definition"] = self.child.to_wire()
        return entry


@attrs.frozen
class FlowSpec:
    """A flow type's definition as a client sent it at ``start_flow``, validated; a flow runs
    to its end with the one it started with."""

    steps: tuple[StepSpec, ...]
    rpcs: frozenset[str]
    #: ``to_wire``'s answer, built once (every flow started with this spec pins it).
    _wire: dict[str, Any] | None = attrs.field(
        default=None, init=False, eq=False, hash=False, repr=False
    )

    def to_wire(self) -> dict[str, Any]:
        """``{"steps": [{"name", "max_attempts", ...}], "rpcs": [names]}``: the same dict on
        every call (shared by the flows that pin it: copy it before changing it)."""
        wire = self._wire
        if wire is None:
            wire = {"steps": [s.to_wire() for s in self.steps], "rpcs": sorted(self.rpcs)}
            object.__setattr__(self, "_wire", wire)
        return wire


def _bad_definition(where: str, expected: str, got: Any) -> ConfigurationError:
    return ConfigurationError(
        f"start_flow definition: {where} must be {expected} (got {got!r}); send the flow"
        " type's definition as the client's Registry builds it"
    )


def _name(where: str, value: Any) -> str:
    if type(value) is not str or not value or len(value) > MAX_NAME_LENGTH:
        raise _bad_definition(
            where, f"a non-empty str of at most {MAX_NAME_LENGTH} characters", value
        )
    return value


def parse_definition(value: Any, _depth: int = 0) -> FlowSpec:
    """Validate a flow type's definition: ``{"steps": [{"name", "kind", "max_attempts",
    "initial_backoff", "backoff_coefficient", "max_backoff", "non_retryable_errors",
    "timeout"[, "flow_type", "definition"]}], "rpcs": [names]}``. Missing retry keys take
    :class:`RetryPolicy`'s defaults, a missing kind is ``execute``, a missing timeout None; a
    ``subflow`` step needs ``flow_type`` (its child's) and may carry the child's
    ``definition`` (nested at most :data:`MAX_DEPTH` deep).

    Raises:
        ConfigurationError: naming the field, what was expected and what was received.
    """
    if _depth > MAX_DEPTH:
        raise _bad_definition(
            "a SubFlow's definition", f"nested at most {MAX_DEPTH} deep", f"depth {_depth}"
        )
    if not isinstance(value, Mapping):
        raise _bad_definition("the definition", 'a dict {"steps": [...], "rpcs": [...]}', value)
    steps_in = value.get("steps", [])
    rpcs_in = value.get("rpcs", [])
    if not isinstance(steps_in, list | tuple):
        raise _bad_definition('"steps"', "a list of step dicts", steps_in)
    if not isinstance(rpcs_in, list | tuple):
        raise _bad_definition('"rpcs"', "a list of RPC names", rpcs_in)
    steps: list[StepSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(steps_in):
        where = f"steps[{i}]"
        if not isinstance(entry, Mapping):
            raise _bad_definition(where, 'a dict with "name"', entry)
        name = _name(f"{where}.name", entry.get("name"))
        if name in seen:
            raise _bad_definition(f"{where}.name", "unique within the flow type", name)
        seen.add(name)
        retry_args = {
            key: entry[key]
            for key in (
                "max_attempts",
                "initial_backoff",
                "backoff_coefficient",
                "max_backoff",
                "non_retryable_errors",
            )
            if entry.get(key) is not None
        }
        try:
            retry = RetryPolicy(**retry_args)
        except ConfigurationError as exc:
            raise ConfigurationError(f"start_flow definition: {where}: {exc.message}") from exc
        timeout = entry.get("timeout")
        if timeout is not None and (
            type(timeout) not in (int, float) or not math.isfinite(timeout) or timeout <= 0
        ):
            raise _bad_definition(f"{where}.timeout", "a number of seconds > 0 or None", timeout)
        kind = entry.get("kind", "execute")
        if kind not in STEP_KINDS or type(kind) is not str:
            raise _bad_definition(f"{where}.kind", " or ".join(map(repr, STEP_KINDS)), kind)
        child_type = child = None
        if kind == "subflow":
            child_type = _name(f"{where}.flow_type", entry.get("flow_type"))
            if entry.get("definition") is not None:
                try:
                    child = parse_definition(entry["definition"], _depth + 1)
                except ConfigurationError as exc:
                    raise ConfigurationError(f"{where}.definition: {exc.message}") from exc
        timeout = None if timeout is None else float(timeout)
        steps.append(StepSpec(name, retry, timeout, kind, child_type, child))
    rpcs = frozenset(_name(f"rpcs[{i}]", r) for i, r in enumerate(rpcs_in))
    return FlowSpec(tuple(steps), rpcs)


def parse_definitions(flows: Any, *, max_flow_types: int) -> dict[str, FlowSpec]:
    """Validate a worker's ``define_flows``: ``{flow_type: definition}``, at most
    ``max_flow_types`` of them, each as :func:`parse_definition` reads it.

    Raises:
        ConfigurationError: naming the flow type and the field that is wrong.
        LimitError: more than ``max_flow_types`` flow types.
    """
    if not isinstance(flows, Mapping):
        raise ConfigurationError(
            f"define_flows: flows must be a dict {{flow_type: definition}} (got {flows!r})"
        )
    if len(flows) > max_flow_types:
        raise LimitError(
            f"define_flows: {len(flows)} flow types, the most matching.max_flow_types="
            f"{max_flow_types} allows: register fewer flow types per worker"
        )
    found: dict[str, FlowSpec] = {}
    for flow_type, definition in flows.items():
        if type(flow_type) is not str or not flow_type or len(flow_type) > MAX_NAME_LENGTH:
            raise ConfigurationError(
                f"define_flows: a flow type must be a non-empty str of at most"
                f" {MAX_NAME_LENGTH} characters (got {flow_type!r})"
            )
        try:
            found[flow_type] = parse_definition(definition)
        except ConfigurationError as exc:
            raise ConfigurationError(f"define_flows: flows[{flow_type!r}]: {exc.message}") from exc
    return found
