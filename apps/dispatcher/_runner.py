"""The dispatcher's runner: :class:`Job` (work that must outlive the caller who started it) and
the body of the runner process, whose nursery runs the jobs. Keyed calls and remote requests
run there.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
import trio


@attrs.frozen
class Job:
    """Work for the dispatcher's runner: ``run`` in its nursery, or ``abandon`` (synchronous)
    if no runner will take it, so that whoever waits for it is answered."""

    run: Callable[[], Awaitable[None]]
    abandon: Callable[[], None]


async def serve_jobs(jobs: trio.MemoryReceiveChannel[Job]) -> None:
    """The runner process: jobs run in its nursery, so they outlive the callers that started
    them. When it ends, the jobs it had not started yet are abandoned (their waiters answered),
    and its channel is closed, so that a job submitted before its restart is abandoned too."""
    try:
        async with trio.open_nursery() as nursery:
            async for job in jobs:
                nursery.start_soon(job.run)
    finally:
        while True:
            try:
                job = jobs.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            job.abandon()
        jobs.close()
