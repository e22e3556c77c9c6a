"""The dispatcher's runner: :class:`Job` (work that must outlive the caller who started it) and
the body of the runner process, whose nursery runs the jobs. Keyed calls and remote requests
run there.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Awaitable, Callable

import attrs
import trio


@attrs.frozen
class Job:
    """Work for the dispatcher's runner: ``run`` in its nursery, or ``abandon`` (synchronous)
    if no runner will take it, so that whoever waits for it is answered."""

    run: Callable[[], Awaitable[None]]
    abandon: Callable[[], None]


@attrs.frozen
class Intake:
    """A serving runner's nursery, where :meth:`start` begins a job at once, in the runner's
    own context (so the job runs as the runner process, never as the caller that submitted
    it): no hop through the runner's channel and a wake-up of the runner for each job."""

    nursery: trio.Nursery
    context: contextvars.Context

    def start(self, job: Job) -> None:
        self.context.run(self.nursery.start_soon, _begin, job)


async def _begin(job: Job) -> None:
    # A job whose runner was stopped before the job's task first ran was never started: it is
    # abandoned, as the jobs still in the channel are (its task inherits the cancellation).
    if trio.current_effective_deadline() == -math.inf:
        job.abandon()
        return
    await job.run()


async def serve_jobs(
    jobs: trio.MemoryReceiveChannel[Job], publish: Callable[[Intake, bool], None]
) -> None:
    """The runner process: jobs run in its nursery, so they outlive the callers that started
    them. It starts the jobs queued before it served, in order, then publishes its
    :class:`Intake` (``publish(intake, True)``), through which later jobs start directly,
    until it stops serving (``publish(intake, False)``). When it ends, the jobs it had not
    started yet are abandoned (their waiters answered), and its channel is closed, so that a
    job submitted before its restart is abandoned too."""
    try:
        async with trio.open_nursery() as nursery:
            intake = Intake(nursery, contextvars.copy_context())
            while True:
                try:
                    job = jobs.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
                intake.start(job)
            publish(intake, True)
            try:
                async for job in jobs:  # (none, unless an intake could not take it)
                    intake.start(job)
            finally:
                publish(intake, False)
    finally:
        while True:
            try:
                job = jobs.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            job.abandon()
        jobs.close()
