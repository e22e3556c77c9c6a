"""The web observer's actions (``--observer-actions``): kill a process, restart a supervisor's
child, scale the dirty pool (as SIGTTIN/SIGTTOU do). Each is a POST with the node's token as
``Authorization: Bearer TOKEN``, and each attempt, allowed or refused, is logged with who asked
(the client's address) and what.

Erlang's observer kills from its process menu and ``supervisor:restart_child`` is a shell
call; here both go through the same guard: off unless asked for, then a token compared in
constant time, then the request checked before anything changes.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

import otp
import supervisors

from ._source import InvalidPid, UnknownPid, local_process

__all__ = ["ACTIONS", "ActionError", "ObserverActions", "new_token"]

logger = logging.getLogger("otp.node.observer.actions")

#: The largest action body read (a pid, a child id and a count fit in far less).
MAX_BODY = 16 * 1024
#: The most workers one scale action adds or removes.
MAX_SCALE = 16
#: The dirty pool's router (registered name), which SIGTTIN/SIGTTOU ask to add/remove workers.
DIRTY_ROUTER = "dirty_router"
#: How long a scale action waits for the pool (adding starts OS processes).
SCALE_TIMEOUT = 60.0


def new_token() -> str:
    """A fresh token for a node whose actions have no token file (printed at boot)."""
    return secrets.token_urlsafe(24)


class ActionError(Exception):
    """An action was refused or could not be done: ``status`` (HTTP), ``error`` (a short
    code) and a message saying what and what to do."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error


def _who(scope: dict[str, Any]) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "unknown client"


def _bearer(scope: dict[str, Any]) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            kind, _, token = value.decode("latin-1").partition(" ")
            if kind.lower() == "bearer":
                return token.strip()
    return None


@attrs.define
class ObserverActions:
    """The guard and the actions of one web observer.

    Args:
        token: What each request must send as ``Authorization: Bearer TOKEN``; None turns every
            action off (each attempt is refused with 403 and a message on how to enable them).
        disabled: The message of that refusal.
    """

    token: str | None = attrs.field(default=None, repr=False)
    disabled: str = (
        "observer actions are off: start the node with --observer-actions (actions = true in"
        " node.toml's [observer]) and send the token it prints as 'Authorization: Bearer TOKEN'"
    )

    @property
    def enabled(self) -> bool:
        return self.token is not None

    async def run(self, name: str, scope: dict[str, Any], body: bytes) -> dict[str, Any]:
        """Do action ``name`` for the request ``scope`` with JSON ``body``; what it did.

        Raises:
            ActionError: refused (403: off, no or wrong token), unknown (404), malformed (400,
                413), its target not found (404) or the target's own refusal (409); nothing
                changed.
        """
        who = _who(scope)
        what = f"{name[:40]} {body[:MAX_BODY].decode('utf-8', 'replace')[:160]}".rstrip()
        try:
            if self.token is None:
                raise ActionError(403, "actions_disabled", self.disabled)
            given = _bearer(scope)
            if given is None:
                raise ActionError(
                    403, "forbidden", "this action needs the token: 'Authorization: Bearer TOKEN'"
                )
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                raise ActionError(403, "forbidden", "wrong token: nothing was done")
            action = ACTIONS.get(name)
            if action is None:
                raise ActionError(
                    404,
                    "unknown_action",
                    f"no action {name[:40]!r}; actions: {', '.join(sorted(ACTIONS))}",
                )
            result = await action(_arguments(body))
        except ActionError as exc:
            logger.warning("observer action %s by %s refused (%s): %s", what, who, exc.error, exc)
            raise
        logger.info("observer action %s by %s: %s", what, who, result)
        return result


def _arguments(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_BODY:
        raise ActionError(413, "too_large", f"an action's body holds at most {MAX_BODY} bytes")
    try:
        value = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ActionError(400, "bad_request", f"the body must be a JSON object ({exc})") from exc
    if not isinstance(value, dict):
        raise ActionError(400, "bad_request", f"the body must be a JSON object (got {value!r:.60})")
    return value


def _text(args: dict[str, Any], key: str, example: str) -> str:
    value = args.get(key)
    if not isinstance(value, str) or not value or len(value) > 300:
        raise ActionError(
            400, "bad_request", f"{key!r} must be a string such as {example} (got {value!r:.60})"
        )
    return value


def _local_pid(text: str) -> otp.Pid:
    """The live local process ``text`` names."""
    try:
        return local_process(text).pid
    except InvalidPid as exc:
        raise ActionError(400, "invalid_pid", str(exc)) from exc
    except UnknownPid as exc:
        raise ActionError(404, "unknown_pid", str(exc)) from exc


async def kill(args: dict[str, Any]) -> dict[str, Any]:
    """``{"pid": "<node.id.creation>"}``: send it the exit signal ``kill`` (untrappable, as
    Erlang's observer does); its supervisor, if any, restarts it."""
    pid = _local_pid(_text(args, "pid", "'<a@host.12.0>'"))
    if pid == otp.self():
        # The request runs in the observer's HTTP process: killing it would cut this answer
        # off, and a restart on port 0 would listen somewhere else than the banner says.
        raise ActionError(
            409,
            "refused",
            f"{pid!r} is the observer's own HTTP process, which serves this request: restart"
            " the observer's 'http' child instead",
        )
    otp.exit(pid, otp.KILL)
    return {"ok": True, "action": "kill", "pid": repr(pid)}


def _child_key(child_id: Any) -> str:
    # Child ids as the tree shows them (the JSON API's text of each id).
    from ._web import plain

    value = plain(child_id)
    return value if isinstance(value, str) else json.dumps(value)


async def restart_child(args: dict[str, Any]) -> dict[str, Any]:
    """``{"supervisor": "<pid>", "child": "id"}``: stop the child and start it again
    (``supervisors.terminate_child`` then ``restart_child``), whatever its restart type."""
    sup = _local_pid(_text(args, "supervisor", "'<a@host.12.0>'"))
    wanted = _text(args, "child", "'worker'")
    view = await supervisors.observe_supervisor(sup)
    if view is None:
        raise ActionError(404, "not_a_supervisor", f"{sup!r} is not a running supervisor")
    ids = {_child_key(c.id): c.id for c in view.children if c.id is not None}
    if wanted not in ids:
        raise ActionError(
            404,
            "unknown_child",
            f"supervisor {sup!r} has no child {wanted!r}; its children: {sorted(ids)}"
            " (a dynamic child has no id: kill its pid instead)",
        )
    stopped = await supervisors.terminate_child(sup, ids[wanted])
    if stopped != "ok":
        raise ActionError(409, "not_restarted", f"terminate_child answered {stopped!r}")
    started = await supervisors.restart_child(sup, ids[wanted])
    if not (isinstance(started, tuple) and started and started[0] == "ok"):
        raise ActionError(409, "not_restarted", f"restart_child answered {started!r}")
    pid = started[1] if len(started) > 1 else None
    return {
        "ok": True,
        "action": "restart_child",
        "supervisor": repr(sup),
        "child": wanted,
        "pid": None if pid is None else repr(pid),
    }


async def scale_dirty(args: dict[str, Any]) -> dict[str, Any]:
    """``{"change": "add" | "remove", "count": 1}``: add or remove dirty workers, as SIGTTIN
    and SIGTTOU do (the pool keeps within its own limits and says so)."""
    change = args.get("change")
    count = args.get("count", 1)
    if change not in ("add", "remove"):
        raise ActionError(
            400, "bad_request", f"'change' must be 'add' or 'remove' (got {change!r:.40})"
        )
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_SCALE:
        raise ActionError(
            400,
            "bad_request",
            f"'count' must be an integer from 1 to {MAX_SCALE} (got {count!r:.40})",
        )
    if otp.whereis(DIRTY_ROUTER) is None:
        raise ActionError(404, "no_dirty_pool", "no dirty pool runs on this node")
    try:
        result = await otp.call(DIRTY_ROUTER, (change, count), timeout=SCALE_TIMEOUT)
    except (otp.CallError, otp.CallTimeout) as exc:
        raise ActionError(409, "not_scaled", f"the dirty pool did not answer: {exc}") from exc
    return {"ok": True, "action": "scale_dirty", "result": result}


#: The actions by name (``POST /api/actions/<name>``).
ACTIONS: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "kill": kill,
    "restart_child": restart_child,
    "scale_dirty": scale_dirty,
}
