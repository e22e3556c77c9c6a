"""The seed's pull-worker example (``examples/python/dex_examples/production/pull_workers.py``),
as it stands apart from imports: a Greeting flow whose Step writes a greeting into the flow's
state and whose RPC reads it, served by a pull worker that dials out to the matching server.

Run a server first (``python -m otp.node --app apps.matching --matching-listen unix:/tmp/m.sock``)
then ``python examples/matching/pull_workers.py unix:/tmp/m.sock``.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

from apps.matching import (
    AsyncClient,
    AsyncWorker,
    BlobCache,
    ClientOptions,
    Flow,
    PullWorkerOptions,
    Registry,
    WorkerOptions,
    rpc,
    step,
)


class GreetingFlow(Flow):
    """A Step writes a greeting into the flow's state; the ``greeting`` RPC reads it."""

    name = "Greeting"

    @step
    async def greet(self, ctx, who: str) -> str:
        ctx.state["greeting"] = f"Hello, {who}!"
        return ctx.state["greeting"]

    @rpc
    async def greeting(self, ctx) -> str | None:
        return ctx.state.get("greeting")


async def start_pull_greeting(
    cache: BlobCache, server_address: str
) -> tuple[GreetingFlow, AsyncWorker, AsyncClient, asyncio.Task[None]]:
    flow = GreetingFlow()
    registry = Registry((flow,), allow_async_handlers=True)
    worker = AsyncWorker(
        registry,
        cache,
        WorkerOptions(
            server_address=server_address,
            pull=PullWorkerOptions(
                max_concurrent_tasks=8,
                # Keep one slot for RPCs so Flows stay responsive.
                reserved_rpc_tasks=1,
            ),
        ),
    )
    worker_task = asyncio.create_task(worker.start())
    client = AsyncClient(
        registry,
        cache,
        ClientOptions(server_address=server_address),
    )
    try:
        await worker.wait_pull_registered(timeout=30)
    except BaseException:
        await stop_pull_greeting(worker, client, worker_task)
        raise
    return flow, worker, client, worker_task


async def stop_pull_greeting(
    worker: AsyncWorker, client: AsyncClient, worker_task: asyncio.Task[None]
) -> None:
    await client.close()
    await worker.close()
    await worker_task


def is_pull_greeting_ready(worker: AsyncWorker) -> bool:
    return worker.pull_registration_state().is_ready


@dataclass(frozen=True)
class PullGreetingDiagnostics:
    is_ready: bool
    reserved_rpc_declines: int


def get_pull_greeting_diagnostics(worker: AsyncWorker) -> PullGreetingDiagnostics:
    return PullGreetingDiagnostics(
        is_ready=worker.pull_registration_state().is_ready,
        reserved_rpc_declines=worker.pull_reserved_rpc_declines,
    )


async def main(server_address: str) -> None:
    flow, worker, client, worker_task = await start_pull_greeting(BlobCache(), server_address)
    try:
        flow_id = await client.start_flow(flow, "world")
        print("result:", await client.result(flow_id, timeout=30))
        print("rpc greeting:", await client.call_rpc(flow_id, "greeting"))
        print("diagnostics:", get_pull_greeting_diagnostics(worker))
    finally:
        await stop_pull_greeting(worker, client, worker_task)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
