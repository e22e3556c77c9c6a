"""Gunicorn 27's own clients (sync, async, stash) and a Gunicorn-written app against our pool."""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import pytest
import trio
import trio.testing

from apps import dirty

from .conftest import APPS, AUDIT, ECHO

GAPP = f"{APPS}:GunicornStyleApp"


async def test_gunicorn_client_errors_are_typed_with_their_fields(
    start_pool: Any, socket_path: str
) -> None:
    gd = pytest.importorskip("gunicorn.dirty")
    await start_pool(dirty_apps=[ECHO, AUDIT], dirty_workers=1)

    def use() -> None:
        client = gd.DirtyClient(socket_path, timeout=10)
        try:
            with pytest.raises(gd.DirtyAppNotFoundError) as nf:
                client.execute("no.such:App", "x")
            assert nf.value.app_path == "no.such:App"
            with pytest.raises(gd.DirtyAppError) as ae:
                client.execute(ECHO, "fail", "kaput")
            assert ae.value.app_path == ECHO and ae.value.action == "fail"
            assert "RuntimeError: kaput" in ae.value.traceback
            with pytest.raises(gd.DirtyAppError, match="Unknown action: _private"):
                client.execute(ECHO, "_private")
            got: list[Any] = []
            with pytest.raises(gd.DirtyAppError, match="broke mid-stream"):
                for x in client.stream(ECHO, "fail_midway", 2):
                    got.append(x)
            assert got == [0, 1]
            assert list(client.stream(AUDIT, "gen_none")) == [None, 0, ""]
            with pytest.raises(gd.DirtyAppError):
                client.execute(AUDIT, "bad_result")
            assert client.execute(ECHO, "add", 1, b=2) == 3
            assert client.execute(ECHO, "async_add", 1, 2) == 3
            assert list(client.stream(ECHO, "acount", 3)) == [0, 1, 2]
        finally:
            client.close()

    await trio.to_thread.run_sync(use)


async def test_gunicorn_async_client_against_the_pool(start_pool: Any, socket_path: str) -> None:
    gd = pytest.importorskip("gunicorn.dirty")
    await start_pool(dirty_workers=1)

    async def main() -> list[Any]:
        client = gd.DirtyClient(socket_path, timeout=10)
        try:
            out = [await client.execute_async(ECHO, "add", 40, 2)]
            out.append([x async for x in client.stream_async(ECHO, "count", 3)])
            try:
                await client.execute_async(ECHO, "fail", "async kaput")
            except gd.DirtyAppError as exc:
                out.append(exc.message)
            out.append(await client.execute_async(ECHO, "echo", "after"))
            return out
        finally:
            await client.close_async()

    got = await trio.to_thread.run_sync(asyncio.run, main())
    assert got == [42, [0, 1, 2], "async kaput", "after"]


async def test_gunicorn_stash_client_full_api(start_pool: Any, socket_path: str) -> None:
    pytest.importorskip("gunicorn.dirty")
    gstash: Any = importlib.import_module("gunicorn.dirty.stash")

    await start_pool(dirty_workers=1)

    def use() -> None:
        s = gstash.StashClient(socket_path, timeout=10)
        try:
            s.ensure("gs")
            assert s.info("gs") == {"size": 0, "table": "gs"}
            s.put("gs", "user:1", 1)
            s.put("gs", "user:2", 2)
            s.put("gs", "x", None)
            assert sorted(s.keys("gs", pattern="user:*")) == ["user:1", "user:2"]
            assert s.exists("gs") and s.exists("gs", "x") and not s.exists("gs", "y")
            assert s.delete("gs", "user:2") is True and s.delete("gs", "user:2") is False
            t = s.table("gs")
            assert len(t) == 2 and "user:1" in t and t["x"] is None
            with pytest.raises(KeyError):
                t["nope"]
            with pytest.raises(KeyError):
                del t["nope"]
            assert sorted(t.items(), key=repr) == [("user:1", 1), ("x", None)]
            s.clear("gs")
            assert s.keys("gs") == [] and s.info("gs")["size"] == 0
            s.delete_table("gs")
            assert "gs" not in s.tables() and not s.exists("gs")
            with pytest.raises(gstash.StashTableNotFoundError):
                s.info("gs")
            with pytest.raises(gstash.StashError):
                s._execute(99, "gs")  # unknown op
            assert s.get("gs", "k", "d") == "d"  # still usable after the errors
        finally:
            s.close()

    await trio.to_thread.run_sync(use)


async def test_gunicorn_written_app_runs_in_the_pool(start_pool: Any, socket_path: str) -> None:
    pytest.importorskip("gunicorn.dirty")
    await start_pool(dirty_apps=[GAPP], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    assert await client.execute_async(GAPP, "add", 1) == 11
    assert await client.execute_async(GAPP, "aadd", 2) == 12
    assert [x async for x in client.stream_async(GAPP, "gen", 3)] == [0, 1, 2]
    assert [x async for x in client.stream_async(GAPP, "agen", 3)] == [0, 1, 2]
    with pytest.raises(dirty.DirtyAppError, match="Unknown action: _hidden"):
        await client.execute_async(GAPP, "_hidden")
    await client.close_async()
