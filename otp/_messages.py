"""The messages the runtime itself puts in mailboxes: trapped exits and monitor notices."""

from __future__ import annotations

from typing import Any

import attrs

from ._ids import Pid, Ref


@attrs.frozen(slots=True)
class Exit:
    """Erlang's ``{'EXIT', Pid, Reason}``: an exit signal received while trapping exits."""

    pid: Pid
    reason: Any


@attrs.frozen(slots=True)
class Down:
    """Erlang's ``{'DOWN', Ref, process, Pid, Reason}``: a monitored process is gone.

    ``pid`` is the monitored pid, or the name (or ``(name, node)``) the monitor was made with.
    """

    ref: Ref
    pid: Any
    reason: Any


@attrs.frozen(slots=True)
class From:
    """Who a ``GenServer`` call came from: pass it to ``GenServer.reply`` to answer later."""

    pid: Pid
    tag: Ref
