"""Dispatch across the servers of a cluster: the matcher's side (MULTISERVER.md, part C).

Each matcher is a member of the ``pg`` groups ``("matching", "flow", flow_type)`` and
``("matching", "worker", app_worker_id)`` while it holds connected streams for that queue (a
draining worker's group it leaves at once), so every server sees where the streams are without
asking anybody. Routing a dispatch (``Matcher._submit``) then goes:

- sticky worker with a stream here -> its queue here, as on one server; with a stream on
  another server only -> forwarded to that server's matcher, which applies the sticky wait and
  its own fallback; with none anywhere -> the flow-type queue at once;
- flow type with streams here -> the queue here; else a server whose matcher has streams for
  it -> forwarded there; none anywhere -> the queue here waits as on one server, and hands its
  waiting dispatches over (``HandOff``) as soon as another server's matcher joins the group.

A forwarded dispatch crosses as a :class:`Forwarded` (the task's deadline made relative, as each
node has its own clock), at most ``MAX_HOPS`` times, so it never circles between servers. The
origin engine gets ``Routed(delivery, "node:<node>", "forwarded")`` for each hop (and watches
that node: ``_engine_remote``); the outcomes come straight from the queue or stream that serves
it, through the distribution, to ``Dispatch.reply_to``.

On one server nothing here sends anything: the groups are joined on a node with no peer, and a
lookup of a group with no member elsewhere is a dict read.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio

import otp

from ._dispatch import Dispatch, Forwarded, Routed

__all__ = ["MAX_HOPS", "HandOff", "RemoteQueues", "group_of"]

logger = logging.getLogger("apps.matching")

#: How many times one dispatch may be forwarded to another server's matcher.
MAX_HOPS = 2


@attrs.frozen
class HandOff:
    """matcher -> a flow-type queue with no stream: another server's matcher has streams for
    the type now; give back the waiting dispatches (as ``Forward``) to go there."""


def group_of(queue_name: str) -> tuple[str, str, str]:
    """The ``pg`` group of the queue ``"flow:<type>"`` or ``"worker:<id>"``."""
    kind, _, name = queue_name.partition(":")
    return ("matching", kind, name)


@attrs.define(eq=False)
class RemoteQueues:
    """The matcher's memberships, and where other servers' matchers hold streams."""

    node: str
    joined: set[tuple[str, str, str]] = attrs.Factory(set)
    #: Which remote member gets the next forward (round robin over a group's members).
    turn: int = 0

    def has_streams(self, queue_name: str) -> None:
        """The queue's first stream here is up."""
        if ":" not in queue_name:
            return  # (a stream of a queue this matcher does not know: no group)
        group = group_of(queue_name)
        if group not in self.joined:
            self.joined.add(group)
            otp.pg.join(group)

    def no_streams(self, queue_name: str) -> None:
        """The queue's last stream here is gone (or its worker is draining)."""
        group = group_of(queue_name)
        if group in self.joined:
            self.joined.discard(group)
            otp.pg.leave(group)

    def member(self, kind: str, name: str, hops: int) -> otp.Pid | None:
        """Another server's matcher with streams for ``kind:name``, or None (none, or the
        dispatch has been forwarded ``MAX_HOPS`` times already)."""
        if hops >= MAX_HOPS:
            return None
        members = otp.pg.get_members(("matching", kind, name))
        if not members:
            return None
        here = self.node
        others = [pid for pid in members if pid.node != here]
        if not others:
            return None
        self.turn += 1
        return others[self.turn % len(others)]

    def forward(self, dispatch: Dispatch, to: otp.Pid, worker_id: str | None) -> bool:
        """Send ``dispatch`` to the matcher ``to`` and tell its ``reply_to``; False if it
        cannot cross (it is routed here then)."""
        try:
            otp.send(to, Forwarded.of(dispatch, trio.current_time()))
        except otp.BadArg as exc:
            logger.error(
                "matching matcher: dispatch %d (flow %r) cannot go to node %s: %s",
                dispatch.task.delivery,
                dispatch.task.flow_id,
                to.node,
                exc,
            )
            return False
        otp.send(
            dispatch.reply_to,
            Routed(dispatch.task.delivery, f"node:{to.node}", "forwarded", worker_id),
        )
        return True


def joined_flow_type(message: Any, node: str) -> str | None:
    """The flow type whose group another server's matcher joined, if ``message`` (a ``pg``
    notice) says so."""
    group = message.group
    if (
        type(group) is tuple
        and len(group) == 3
        and group[0] == "matching"
        and group[1] == "flow"
        and any(pid.node != node for pid in message.pids)
    ):
        return str(group[2])
    return None
