"""What comes for the engine handed to it by the task that has it, instead of sent: the
client's calls by its connection's reader, the worker's outcome of an RPC or of a flow's last
Step by the stream that read it, and a commit's answer by the ``StoreServer`` that ran it in
the engine's own handling.

The engine registers itself as it starts (``register``). The task that reads an M_CALL
``call_rpc`` or ``result`` (its connection's reader) hands the engine the request
(``call_taker``: ``otp.send_request``'s ``hand_over``), and the task that runs the stream
that reads a RESULT or FAILURE (that connection's reader, most often) hands it the outcome
(``to_engine``); each runs the engine's handling itself, on the engine's state, as
``StreamHandle`` and ``QueueHandle`` do for a stream and a queue: the engine's handling never
waits and runs in the same trio thread, so its task is not woken, the TASK goes out in the
first reader's scheduling batch, and the answer to the RPC's caller (through its
``on_response``: the client's connection) in the second's (issue 15: two wake-ups of the
server less per RPC). A commit that handling makes, run to its end there by an idle
``StoreServer`` (``StoreHandle``), answers the engine in the same place (``committed_to``):
what waited for it (a flow's end, its ``result`` waiters answered) goes on there too, so a
lone Step's end wakes no task of the engine's.

The engine takes any of these only while its mailbox is empty and it is not handling
something else itself (``FlowEngine._take_call``, ``_take_outcome`` and ``_take_committed``
say the rest), so nothing it was sent before is overtaken: the call's ``Routed``
"delivered" that came by message is handled first; a ``result`` and a flow's end only while
nothing else is in flight (under load the engine's own pass takes them by message and commits
them together). Otherwise, and for any ``reply_to`` not registered (another node's engine, a
test's process), it is sent as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import trio

import otp

from ._dispatch import Completed, Failed
from ._store_records import BatchCommitted

__all__ = ["Takers", "call_taker", "committed_to", "register", "registry", "to_engine"]


def _never(answer: BatchCommitted) -> bool:
    return False


@attrs.frozen(eq=False)
class Takers:
    """What an engine does with what is handed to it, each True if it took it: an outcome
    (``Completed``/``Failed``), a call (``from_``, the request, as ``handle_call`` gets it),
    a commit's answer (``BatchCommitted``)."""

    outcome: Callable[[Completed | Failed], bool]
    call: Callable[[otp.From, Any], bool]
    committed: Callable[[BatchCommitted], bool] = _never


#: Engine pid -> its takers, for this trio run (one node's engines).
_TAKERS: trio.lowlevel.RunVar[dict[Any, Takers]] = trio.lowlevel.RunVar("matching_engine_takers")


def registry() -> dict[Any, Takers]:
    """This trio run's engines' takers by pid and name, as ``register`` fills it: what
    ``call_taker`` and ``to_engine`` look in (a connection and a stream keep it, one
    ``RunVar`` read less a call)."""
    try:
        return _TAKERS.get()
    except LookupError:
        registered: dict[Any, Takers] = {}
        _TAKERS.set(registered)
        return registered


def register(pid: otp.Pid, takers: Takers) -> None:
    """(From the engine ``pid``'s own task.) Hand ``pid`` what comes for it to ``takers``
    from now on, until the process exits; found by its registered name too (a connection
    names the engine: no ``otp.whereis`` a call)."""
    registered = registry()
    info = otp.process_info(pid)
    keys = (pid,) if info is None or info.registered_name is None else (pid, info.registered_name)
    for key in keys:
        registered[key] = takers

    def forget(pid: otp.Pid, reason: Any) -> None:
        for key in keys:
            if registered.get(key) is takers:
                del registered[key]

    otp.add_exit_hook(forget)


def call_taker(
    engine: Any, registered: dict[Any, Takers] | None = None
) -> Callable[[otp.From, Any], bool] | None:
    """The ``hand_over`` of ``otp.send_request`` for a call to ``engine`` (a name or pid of
    this node), or None: the engine is not registered (in ``registered``, this run's
    ``registry()`` if given). (A name it registered under is looked up as it was when it
    registered: an engine keeps its name until it exits.)"""
    if registered is None:
        registered = registry()
    takers = registered.get(engine)
    if takers is None and type(engine) is str:
        takers = registered.get(otp.whereis(engine))
    return None if takers is None else takers.call


def to_engine(
    reply_to: Any, outcome: Completed | Failed, registered: dict[Any, Takers] | None = None
) -> None:
    """``otp.send(reply_to, outcome)``, or its handling by the engine ``reply_to`` in the
    calling task when it takes it (see the module's docstring; ``registered``: this run's
    ``registry()``, if kept). Raises as ``otp.send``."""
    takers = (registry() if registered is None else registered).get(reply_to)
    if takers is None or not takers.outcome(outcome):
        otp.send(reply_to, outcome)


def committed_to(reply_to: Any, answer: BatchCommitted) -> None:
    """``otp.send(reply_to, answer)``, or its handling by the engine ``reply_to`` when it takes
    it (it does only inside its own handling running in another task: see the module's
    docstring). Raises as ``otp.send``."""
    takers = _takers_of(reply_to)
    if takers is None or not takers.committed(answer):
        otp.send(reply_to, answer)


def _takers_of(pid: Any) -> Takers | None:
    try:
        return _TAKERS.get().get(pid)
    except LookupError:
        return None
