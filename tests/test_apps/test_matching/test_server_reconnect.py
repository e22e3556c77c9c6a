"""A server-requested reconnect (seed, 容量和关闭: when the server asks a worker to reconnect,
the worker first finishes its running calls; ARCHITECTURE.md's M_RECONNECT). The worker's side
is tested against a fake server in test_worker_engine.py; these tests ask the real server to
send it when it stops gracefully."""

from __future__ import annotations

import pytest
import trio

import supervisors
import wire

from ._in_process import BOUND, matching_server
from ._peers import Peer

DEFINITION = {
    "steps": [
        {
            "name": "write",
            "max_attempts": 1,
            "initial_backoff": 1.0,
            "backoff_coefficient": 2.0,
            "max_backoff": 10.0,
            "timeout": None,
        }
    ],
    "rpcs": [],
}


@pytest.mark.xfail(
    strict=True,
    reason="the server never sends M_RECONNECT: a graceful stop brutal-kills the worker"
    " connections (_listener.py _acceptor: shutdown='brutal_kill'; _connection.py has no"
    " message that writes wire.MatchReconnect and waits for the running calls)",
)
async def test_a_graceful_stop_asks_workers_with_running_calls_to_reconnect():
    async with matching_server() as address:
        path = address.removeprefix("unix:")
        worker, client = await Peer.unix(path), await Peer.unix(path)
        await worker.hello("worker", worker_id="w1", flows={"G": {"steps": ["write"], "rpcs": []}})
        await worker.send(wire.MatchRegister("flow", "G", rid=1))
        assert type(await worker.receive_not_ping()) is wire.MatchRegistered
        await client.hello("client")
        started = await client.call(
            1, "start_flow", flow_type="G", flow_id="f1", args=[], definition=DEFINITION
        )
        assert started.value == "f1"
        task = await worker.receive_not_ping()
        assert type(task) is wire.MatchTask
        await worker.send(wire.MatchAccept(task.delivery, rid=1))
        received = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisors.stop_application, "matching")
            with trio.fail_after(BOUND):
                while (msg := await worker.receive()) is not None:
                    received.append(msg)
                    if type(msg) is wire.MatchReconnect:
                        # the running call finishes on this connection before it closes
                        await worker.send(wire.MatchResult(task.delivery, "ok", {}, rid=1))
        await worker.aclose()
        await client.aclose()
    assert any(type(m) is wire.MatchReconnect for m in received)
