"""Attaching to a running node over distribution as a hidden node (Erlang's ``-hidden``), and
asking its observer agent (``otp.node``'s ``observer_agent`` application) for snapshots.

The attaching node listens nowhere and is hidden, so the node it attaches to lists it in no
node list it tells others, and neither side's process groups see the other: the cluster looks
as it did. A failed attach (no such address, a wrong cookie, another node at the address, no
agent) is an :class:`AttachError` that says which, and leaves the target as it was: the
handshake fails before the attaching side proves the cookie, so the target never counts it as
connected.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import attrs

from .._dist_config import DistConfig, TlsConfig, parse_address
from .._dist_connection import BAD_COOKIE as _BAD_COOKIE
from .._dist_connection import REFUSED as _REFUSED
from .._dist_connection import UNREACHABLE as _UNREACHABLE
from .._dist_connection import WRONG_NODE as _WRONG_NODE
from .._dist_connection import ConnectionFailure
from .._dist_handshake import is_node_name
from .._distribution import dial, start_distribution
from .._errors import CallError, CallTimeout, NoProc, OtpError
from .._gen_server import call

#: The registered name of a node's observer agent.
AGENT_NAME = "otp.observer_agent"

#: Why an attach failed: AttachError.kind.
UNREACHABLE = "unreachable"
BAD_COOKIE = "bad_cookie"
WRONG_NODE = "wrong_node"
REFUSED = "refused"
NO_AGENT = "no_agent"
LOST = "lost"


class AttachError(OtpError):
    """Attaching to a node, or asking it, failed; ``kind`` says why (``"unreachable"``,
    ``"bad_cookie"``, ``"wrong_node"``, ``"refused"``, ``"no_agent"``, ``"lost"``)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def observer_name(target: str) -> str:
    """A fresh name for an observer attaching to ``target`` (its host, this OS pid and a random
    part: two observers, or an observer and a real node, never share a name)."""
    host = target.partition("@")[2] or "localhost"
    return f"observer-{os.getpid()}-{secrets.token_hex(3)}@{host}"


@attrs.frozen
class RemoteNode:
    """A node attached to; each method asks its agent once (a call of at most ``timeout``
    seconds).

    Raises (every method):
        AttachError: the connection is lost (``"lost"``) or the agent does not answer.
    """

    name: str
    timeout: float = 10.0

    async def ask(self, request: Any) -> Any:
        """The agent's answer to ``request`` (see ``otp.node.ObserverAgent``)."""
        try:
            answer = await call((AGENT_NAME, self.name), request, timeout=self.timeout)
        except NoProc:
            raise AttachError(
                NO_AGENT,
                f"node {self.name} runs no observer agent ({AGENT_NAME!r} is not registered"
                " there): boot it with python -m otp.node, or start"
                " otp.node.observer_agent_application() on it",
            ) from None
        except CallTimeout:
            raise AttachError(
                LOST, f"node {self.name}'s observer agent did not answer in {self.timeout} s"
            ) from None
        except CallError as exc:
            raise AttachError(LOST, f"node {self.name}: {exc}") from None
        if not (isinstance(answer, tuple) and len(answer) == 2 and answer[0] in ("ok", "error")):
            raise AttachError(NO_AGENT, f"node {self.name} answered {answer!r:.80}")
        if answer[0] == "error":
            raise AttachError(REFUSED, str(answer[1]))
        return answer[1]

    async def info(self) -> dict[str, Any]:
        """The node's name, the agent's protocol and its running applications."""
        return dict(await self.ask("info"))

    async def processes(self) -> dict[str, Any]:
        """``{"time", "columns", "rows"}``: every process as a compact row (for ``--top``)."""
        return dict(await self.ask("processes"))

    async def snapshot(self) -> dict[str, Any]:
        """``otp.observer.snapshot()`` of the node, as plain values (pids as text)."""
        return dict(await self.ask("snapshot"))

    async def tree(self) -> dict[str, Any]:
        """``{"node", "applications"}``: ``supervisors.observe()`` there, as plain values."""
        return dict(await self.ask("tree"))

    async def process(self, pid: str) -> dict[str, Any] | None:
        """One process's snapshot (``pid`` as its text), or None if it is not alive."""
        found = await self.ask(("process", pid))
        return None if found is None else dict(found)

    async def readiness(self) -> dict[str, str]:
        """What is not ready there, by application (empty: all ready)."""
        return dict(await self.ask("readiness"))

    async def metrics(self, accept: str = "") -> tuple[bytes, str]:
        """The node's own ``/metrics`` body and content type (for ``accept``)."""
        body, content_type = await self.ask(("metrics", accept))
        return bytes(body), str(content_type)


async def attach(
    node: str,
    address: str,
    cookie: bytes,
    *,
    tls: TlsConfig | None = None,
    insecure_tcp: bool = False,
    timeout: float = 10.0,
) -> RemoteNode:
    """Make this node (open, named, not yet distributed) a hidden node, connect it to ``node``
    at ``address`` and check that an observer agent answers there.

    Raises:
        AttachError: the node cannot be reached, refused us, is another node, or runs no agent.
        otp.DistributionError: ``address`` or the settings are malformed.
    """
    if not is_node_name(node):
        raise AttachError(
            WRONG_NODE, f"--node {node!r} is no node name (name@host, as the node was started)"
        )
    parse_address(address)
    await start_distribution(
        DistConfig(
            cookie=cookie,
            tls=tls,
            insecure_tcp=insecure_tcp,
            mesh=False,
            hidden=True,
            handshake_timeout=timeout,
        )
    )
    with _quiet_dist_log():
        conn = await dial(node, address)
    if conn is None or conn.state != "up":
        raise _attach_error(node, address, conn.failure if conn is not None else None)
    remote = RemoteNode(node, timeout)
    await remote.info()
    return remote


@contextmanager
def _quiet_dist_log() -> Iterator[None]:
    """Keep the distribution's log quiet while dialling: a failed dial is logged, not raised
    (dial() answers as Erlang's net_kernel:connect_node does), and the attach's own error
    tells why once, from the connection's failure."""
    dist_logger = logging.getLogger("otp.dist")
    handler = logging.NullHandler()  # (no handler at all would bring logging's last resort)
    dist_logger.addHandler(handler)
    propagate, dist_logger.propagate = dist_logger.propagate, False
    try:
        yield
    finally:
        dist_logger.removeHandler(handler)
        dist_logger.propagate = propagate


#: What an attach says for each ConnectionFailure.kind it tells apart (any other: refused).
_SAYS = {
    _BAD_COOKIE: (BAD_COOKIE, "wrong cookie"),
    _WRONG_NODE: (WRONG_NODE, "wrong node name"),
    _REFUSED: (REFUSED, "refused"),
    _UNREACHABLE: (UNREACHABLE, "unreachable"),
}


def _attach_error(node: str, address: str, failure: ConnectionFailure | None) -> AttachError:
    where = f"cannot attach to {node} at {address}"
    if failure is None:
        return AttachError(UNREACHABLE, f"{where}: unreachable (nothing answered there)")
    says = _SAYS.get(failure.kind)
    if says is None:
        return AttachError(REFUSED, f"{where}: {failure.reason}")
    kind, what = says
    return AttachError(kind, f"{where}: {what} ({failure.reason})")
