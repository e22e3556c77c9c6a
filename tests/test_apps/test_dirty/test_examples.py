"""The bundled example app (what ``python -m otp.node`` hosts by default), in real workers."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest
import trio

from apps import dirty
from apps.dirty.examples import EXAMPLE_APP, ExampleApp, PillowMissingError
from otp import node


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, format="PNG")
    return out.getvalue()


async def test_example_app_calls_streams_model_and_thumbnail(
    start_pool: Any, socket_path: str
) -> None:
    pytest.importorskip("PIL")
    await start_pool(dirty_apps=[EXAMPLE_APP], dirty_workers=1)
    client = dirty.DirtyClient(socket_path)
    assert await client.execute_async(EXAMPLE_APP, "upper", "dirty") == "DIRTY"
    assert [x async for x in client.stream_async(EXAMPLE_APP, "count", 3)] == [0, 1, 2]
    assert [x async for x in client.stream_async(EXAMPLE_APP, "words", "a b")] == ["a", "b"]
    happy = await client.execute_async(EXAMPLE_APP, "predict", "What a great, lovely day")
    assert happy["label"] == "positive" and happy["words"] == ["great", "lovely"]
    sad = await client.execute_async(EXAMPLE_APP, "predict", "awful and slow")
    assert sad["label"] == "negative" and sad["score"] < 0.05
    counted = await client.execute_async(EXAMPLE_APP, "word_count", "b a b c a b", top=2)
    assert counted == {"total": 6, "top": [["b", 3], ["a", 2]]}
    thumb = await client.execute_async(EXAMPLE_APP, "thumbnail", _png(400, 200), size=64)
    assert (thumb["width"], thumb["height"], thumb["format"]) == (64, 32, "PNG")
    assert thumb["data"].startswith(b"\x89PNG")
    with pytest.raises(dirty.DirtyAppError, match="not an image"):
        await client.execute_async(EXAMPLE_APP, "thumbnail", b"nope")
    await client.close_async()


def test_thumbnail_without_pillow_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)  # as on a machine without Pillow
    app = ExampleApp()
    app.init()
    with pytest.raises(PillowMissingError, match=r"pip install 'pillow>=10'"):
        app("thumbnail", b"")
    assert app("info")["pillow"] is False


def test_the_default_application_hosts_the_example_unless_told_otherwise() -> None:
    default = dirty.default_application(node.NodeConfig())
    assert EXAMPLE_APP in (default.description or "")
    assert "GUNICORN_DIRTY_SOCKET=" in (default.description or "")
    ours = "tests.test_apps.test_dirty.dirty_apps:EchoApp"
    custom = dirty.default_application(node.NodeConfig(settings={"dirty": {"dirty_apps": [ours]}}))
    assert ours in (custom.description or "") and EXAMPLE_APP not in (custom.description or "")


def test_the_default_node_runs_one_worker_unless_told_and_zero_workers_disables_it() -> None:
    default = dirty.default_application(node.NodeConfig())
    assert "dirty worker pool, 1 worker(s) hosting" in (default.description or "")
    off = dirty.default_application(node.NodeConfig(settings={"dirty": {"dirty_workers": 0}}))
    assert off.description == "dirty worker pool, disabled (dirty_workers = 0, no dirty_apps)"


async def test_example_app_bad_arguments_are_typed_app_errors(
    start_pool: Any, socket_path: str
) -> None:
    pytest.importorskip("PIL")
    await start_pool(dirty_apps=[EXAMPLE_APP], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)

    def calls() -> None:
        png = _png(20, 10)
        bad: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
            ("upper", (5,), {}),
            ("predict", (None,), {}),
            ("word_count", (["a"],), {}),
            ("thumbnail", (png,), {"size": True}),
            ("thumbnail", (png,), {"size": 1.5}),
            ("thumbnail", (png,), {"format": "NOPE"}),
            ("thumbnail", ("not bytes",), {}),
            ("upper", (), {}),
            ("echo", (1, 2), {}),
        ]
        for action, args, kwargs in bad:
            with pytest.raises(dirty.DirtyAppError) as info:
                client.execute(EXAMPLE_APP, action, *args, **kwargs)
            assert info.value.action == action and info.value.app_path == EXAMPLE_APP
        with pytest.raises(dirty.DirtyAppError):
            list(client.stream(EXAMPLE_APP, "count", "three"))
        with pytest.raises(dirty.DirtyAppError, match="Unknown action: no_such_action"):
            client.execute(EXAMPLE_APP, "no_such_action")
        # the worker survives all that
        assert client.execute(EXAMPLE_APP, "upper", "ok") == "OK"
        jpeg = client.execute(EXAMPLE_APP, "thumbnail", png, size=4, format="jpeg")
        assert jpeg["format"] == "JPEG" and jpeg["data"][:2] == b"\xff\xd8"

    await trio.to_thread.run_sync(calls)
    client.close()


async def test_example_word_count_negative_top_is_refused_or_empty(
    start_pool: Any, socket_path: str
) -> None:
    """``top`` is how many words to return: a negative ``top`` must not silently drop the least
    frequent words from an otherwise full answer."""
    await start_pool(dirty_apps=[EXAMPLE_APP], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    try:
        got = await trio.to_thread.run_sync(
            lambda: client.execute(EXAMPLE_APP, "word_count", "a a b c", top=-1)
        )
        assert got["top"] == []
    except dirty.DirtyAppError:
        pass
    finally:
        client.close()


async def test_example_thumbnail_accepts_the_jpg_spelling(
    start_pool: Any, socket_path: str
) -> None:
    pytest.importorskip("PIL")
    await start_pool(dirty_apps=[EXAMPLE_APP], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    try:
        got = await trio.to_thread.run_sync(
            lambda: client.execute(EXAMPLE_APP, "thumbnail", _png(8, 8), size=4, format="jpg")
        )
        assert got["data"][:2] == b"\xff\xd8"
    finally:
        client.close()
