"""The ``observer`` application: the node's HTTP endpoint (``--observer HOST:PORT``), served by
hypercorn's trio worker in one supervised process, and the sampler its charts read.

The process binds, then tells the supervisor starting it where it listens (OTP's
``proc_lib:init_ack``), so a port that cannot be bound fails the application's start with the
reason, and port 0's pick is known when the node prints its banner.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

import otp
import supervisors

from ._actions import ObserverActions, new_token
from ._config import ObserverSettings
from ._sampler import start_sampler
from ._web import ObserverWeb

__all__ = [
    "OBSERVER_APPLICATION",
    "observer_actions_banner",
    "observer_address",
    "observer_application",
]

logger = logging.getLogger("otp.node.observer")

#: The application's name.
OBSERVER_APPLICATION = "observer"
#: How long the HTTP process may take to bind before its start fails.
BIND_TIMEOUT = 10.0

_ADDRESS: trio.lowlevel.RunVar[str | None] = trio.lowlevel.RunVar("otp_node_observer", default=None)
#: The serving observer's actions, and whether their token was made at boot (so printed).
_ACTIONS: trio.lowlevel.RunVar[tuple[ObserverActions, bool] | None] = trio.lowlevel.RunVar(
    "otp_node_observer_actions", default=None
)


def observer_address() -> str | None:
    """Where this node's observer listens (``http://127.0.0.1:PORT``), or None."""
    return _ADDRESS.get()


def observer_application(
    settings: ObserverSettings, expected: tuple[str, ...] = ()
) -> supervisors.Application:
    """The ``observer`` application serving on ``settings``'s address; ``/readyz`` waits for
    the applications named in ``expected``. With ``settings.actions``, its actions take
    ``settings.token``, or a token made now (printed by the banner) if that is None."""
    actions = ObserverActions()
    if settings.actions:
        actions = ObserverActions(token=settings.token or new_token())
    web = ObserverWeb(expected=expected, actions=actions)
    generated = settings.actions and settings.token is None
    return supervisors.Application(
        OBSERVER_APPLICATION,
        (
            supervisors.SupFlags(strategy="one_for_one", intensity=3, period=5),
            [
                supervisors.ChildSpec("sampler", start_sampler),
                supervisors.ChildSpec("http", (start_http, web, settings, generated), shutdown=2.0),
            ],
        ),
        description="the node's HTTP observer (/metrics, /healthz, /readyz, /api/...)",
        version="0.1.0",
        observer_view=lambda: {"address": observer_address()},
    )


def observer_actions_banner() -> str | None:
    """What the boot banner says of the observer's actions: None if they are off."""
    found = _ACTIONS.get()
    address = _ADDRESS.get()
    if found is None or not found[0].enabled:
        return None
    actions, generated = found
    if not generated:
        return "observer actions on (token from the token file)"
    return (
        f"observer actions on: token {actions.token} (send 'Authorization: Bearer TOKEN', or"
        f" open {address}/#token={actions.token})"
    )


async def start_http(web: ObserverWeb, settings: ObserverSettings, generated: bool = False) -> Any:
    """Start the HTTP process linked to the caller; its pid once it listens, or
    ``("error", reason)`` if it cannot bind within :data:`BIND_TIMEOUT` seconds."""
    tag = otp.make_ref()
    pid = otp.spawn_link(_serve, web, settings, generated, otp.self(), tag)
    answer = await otp.receive(
        lambda m: (
            (m.__class__ is tuple and len(m) == 3 and m[0] == tag)
            or (m.__class__ is otp.Exit and m.pid == pid)
        ),
        timeout=BIND_TIMEOUT,
        default=None,
    )
    if answer is not None and answer.__class__ is tuple and answer[1] == "ok":
        return pid
    otp.unlink(pid)
    otp.exit(pid, otp.KILL)
    await otp.receive(lambda m: m.__class__ is otp.Exit and m.pid == pid, timeout=0, default=None)
    if answer is None:
        return ("error", "timeout")
    if answer.__class__ is otp.Exit:
        return ("error", answer.reason)
    return ("error", answer[2])


def _bind(settings: ObserverSettings) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"{host}:{settings.port}"


async def _serve(
    web: ObserverWeb, settings: ObserverSettings, generated: bool, parent: otp.Pid, tag: Any
) -> None:
    # Imported here: every node imports otp.node (a dirty worker too), few serve HTTP.
    import hypercorn.config
    import hypercorn.trio

    config = hypercorn.config.Config()
    config.bind = [_bind(settings)]
    config.accesslog = None
    config.errorlog = logging.getLogger("otp.node.observer.http")
    config.graceful_timeout = 1.0
    async with trio.open_nursery() as nursery:
        failed: BaseException | None = None
        try:
            binds = await nursery.start(hypercorn.trio.serve, web, config)
        except* OSError as group:
            failed = group.exceptions[0]
        if failed is not None:
            otp.send(parent, (tag, "error", f"cannot listen on {_bind(settings)}: {failed}"))
            return
        address = binds[0]
        _ADDRESS.set(address)
        _ACTIONS.set((web.actions, generated))
        logger.info(
            "observer listening on %s (actions %s)", address, "on" if web.actions.enabled else "off"
        )
        otp.send(parent, (tag, "ok", address))
        try:
            await trio.sleep_forever()
        finally:
            if _ADDRESS.get() == address:
                _ADDRESS.set(None)
                _ACTIONS.set(None)
