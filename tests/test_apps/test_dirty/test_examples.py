"""The bundled example app (what ``python -m otp.node`` hosts by default), in real workers."""

from __future__ import annotations

import io
import sys
from typing import Any

import pytest

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
