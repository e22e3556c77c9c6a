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
import trio

from .._dist_handshake import BadCookie, HandshakeError, WrongNode, is_node_name
from .._distribution import DistConfig, TlsConfig, connect, parse_address, start_distribution
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
    with _dial_failures() as failures:
        connected = await connect(node, address)
    if not connected:
        raise _attach_error(node, address, failures)
    remote = RemoteNode(node, timeout)
    await remote.info()
    return remote


@contextmanager
def _dial_failures() -> Iterator[list[logging.LogRecord]]:
    """The distribution's log records while dialling: a failed dial is logged, not raised
    (connect() is Erlang's net_kernel:connect_node, which answers false), and they say why.
    Kept from the log (and stderr) meanwhile: the attach's own error tells it once."""
    records: list[logging.LogRecord] = []
    handler = _Collect(records)
    dist_logger = logging.getLogger("otp.dist")
    dist_logger.addHandler(handler)
    propagate, dist_logger.propagate = dist_logger.propagate, False
    try:
        yield records
    finally:
        dist_logger.removeHandler(handler)
        dist_logger.propagate = propagate


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.INFO)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _attach_error(node: str, address: str, records: list[logging.LogRecord]) -> AttachError:
    where = f"cannot attach to {node} at {address}"
    for record in reversed(records):
        args = record.args if isinstance(record.args, tuple) else ()
        for arg in args:
            if isinstance(arg, BadCookie):
                return AttachError(BAD_COOKIE, f"{where}: wrong cookie ({arg})")
            if isinstance(arg, WrongNode):
                return AttachError(WRONG_NODE, f"{where}: wrong node name ({arg})")
            if isinstance(arg, HandshakeError):
                return AttachError(REFUSED, f"{where}: refused ({arg})")
            if isinstance(arg, OSError | trio.BrokenResourceError):
                return AttachError(UNREACHABLE, f"{where}: unreachable ({arg})")
        if record.levelno >= logging.WARNING:
            return AttachError(REFUSED, f"{where}: {record.getMessage()}")
    return AttachError(UNREACHABLE, f"{where}: unreachable (nothing answered there)")
