"""The SDK's trio flavour: the engines themselves, with the seed's ``start()`` and ``async
with`` (:class:`TrioWorker`, :class:`TrioClient`)."""

from __future__ import annotations

from ._client_engine import ClientEngine
from ._worker_engine import WorkerEngine

__all__ = ["TrioClient", "TrioWorker"]


class TrioWorker(WorkerEngine):
    """The pull worker for trio programs: the engine itself, with the seed's ``start()``.

    ``await worker.start()`` serves until ``await worker.close()`` has drained (run it in a
    nursery); ``async with TrioWorker(...)`` closes it on the way out.
    """

    async def start(self) -> None:
        """Serve until :meth:`close` (the same as :meth:`run`)."""
        await self.run()

    async def __aenter__(self) -> TrioWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class TrioClient(ClientEngine):
    """The client for trio programs: the engine itself (``async with`` closes it)."""

    async def __aenter__(self) -> TrioClient:
        return self
