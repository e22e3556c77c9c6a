"""Where the web observer reads a node from: one "source" object, so the same pages serve the
local node (:class:`LocalSource`) or a remote one attached over distribution.

Every method is async (a remote source asks over distribution) and returns plain JSON-ready
values (dicts, lists, str, int, float, bool, None); pids travel as their text
(``<node.id.creation>``).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

import attrs

import otp
import supervisors

__all__ = [
    "InvalidPid",
    "LocalSource",
    "ObserverSource",
    "UnknownPid",
    "local_process",
    "parse_pid_text",
]

#: How many of a mailbox's oldest messages a process's detail shows, and how long each may be.
MAILBOX_HEAD = 10
MESSAGE_TEXT = 200


class InvalidPid(ValueError):
    """A pid's text is malformed (not ``<node.id.creation>``)."""


class UnknownPid(LookupError):
    """No live process has this pid (here: on the source's node)."""


class ObserverSource(Protocol):
    """What :class:`~otp.node.ObserverWeb` shows, from one node."""

    async def node(self) -> dict[str, Any]:
        """``{"node": name, "os_pid": int}``."""
        ...

    async def processes(self) -> list[dict[str, Any]]:
        """Every live process: ``plain(otp.observer.ProcessSnapshot)`` rows."""
        ...

    async def process(self, pid: str) -> dict[str, Any]:
        """One process's row plus ``mailbox_head`` (texts of its oldest messages).

        Raises:
            InvalidPid: ``pid`` is malformed.
            UnknownPid: no live process has it.
        """
        ...

    async def applications(self) -> list[dict[str, Any]]:
        """``plain(supervisors.observe())``: each application's tree and view."""
        ...

    async def snapshot(self) -> dict[str, Any]:
        """``plain(otp.observer.snapshot())`` (processes, tables, ports, connections)."""
        ...

    async def tables(self) -> list[dict[str, Any]]:
        """``plain(otp.observer.observe_tables())``: every ETS table."""
        ...

    async def series(self) -> dict[str, Any]:
        """The sampler's rates over the last minutes (``"series"`` of ``otp.node``'s
        sampler), or the same shape with no points and a ``message`` if no sampler runs."""
        ...


def parse_pid_text(text: str) -> tuple[str, int, int]:
    """``"<a@host.12.0>"`` (the brackets optional) -> ``("a@host", 12, 0)``.

    Raises:
        InvalidPid: it is not of that form.
    """
    body = text[1:-1] if text.startswith("<") and text.endswith(">") else text
    node, _, rest = body.rpartition(".")
    node, _, serial = node.rpartition(".")
    if not node or not serial.isdigit() or not rest.isdigit():
        raise InvalidPid(f"{text!r} is not a pid: pids read <node.id.creation>, e.g. <a@h.12.0>")
    return node, int(serial), int(rest)


def local_process(text: str) -> Any:
    """The live process of this node that the pid's ``text`` names (the runtime's record).

    Raises:
        InvalidPid: ``text`` is malformed.
        UnknownPid: no live process of this node has it (another node's pid included).
    """
    node, serial, creation = parse_pid_text(text)
    local = otp.current_node()
    proc = local.processes.get(serial)
    if (
        node != local.name
        or creation != local.creation
        or proc is None
        or not proc.alive
        or repr(proc.pid) != f"<{node}.{serial}.{creation}>"
    ):
        raise UnknownPid(f"no live process {text} on {local.name}")
    return proc


@attrs.define
class LocalSource:
    """The node this code runs in (called from within one of its processes)."""

    async def node(self) -> dict[str, Any]:
        return {"node": otp.node_name(), "os_pid": os.getpid()}

    async def processes(self) -> list[dict[str, Any]]:
        from ._web import plain

        return [plain(p) for p in otp.observer.observe_processes()]

    async def process(self, pid: str) -> dict[str, Any]:
        from ._web import plain

        proc = local_process(pid)
        found = otp.observer.observe_process(proc.pid)
        if found is None:
            raise UnknownPid(f"no live process {pid} on {otp.node_name()}")
        row = plain(found)
        mailbox = list(proc._mailbox or ())[:MAILBOX_HEAD]
        row["mailbox_head"] = [repr(m)[:MESSAGE_TEXT] for m in mailbox]
        return dict(row)

    async def applications(self) -> list[dict[str, Any]]:
        from ._web import plain

        return list(plain(await supervisors.observe()))

    async def snapshot(self) -> dict[str, Any]:
        from ._web import plain

        return dict(plain(otp.observer.snapshot()))

    async def tables(self) -> list[dict[str, Any]]:
        from ._web import plain

        return list(plain(otp.observer.observe_tables()))

    async def series(self) -> dict[str, Any]:
        from ._sampler import SAMPLER_NAME, SERIES

        try:
            return dict(await otp.call(SAMPLER_NAME, "series", timeout=5.0))
        except (otp.CallError, otp.CallTimeout, otp.NoProc):
            return {
                "interval": None,
                "window": 0,
                "now": None,
                "t": [],
                "series": {name: [] for name in SERIES},
                "message": f"no sampler runs on {otp.node_name()} (the observer application"
                " runs it: start the node with --observer)",
            }
