"""examples/flask_dirty as a user runs it: the node and a real gunicorn serving the Flask app, as
OS processes, driven by real HTTP requests."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio

from apps import dirty
from apps.dirty.examples import EXAMPLE_APP

pytest.importorskip("flask")
pytest.importorskip("gunicorn")
Image = pytest.importorskip("PIL.Image")

ROOT = Path(__file__).resolve().parents[3]


class Proc:
    """A process whose output goes to a file we can poll."""

    def __init__(self, log: Path, args: list[str], env: dict[str, str]) -> None:
        self.log, self.args, self.env = log, args, env

    async def __aenter__(self) -> Proc:
        self.out = open(self.log, "wb")
        self.process = await trio.lowlevel.open_process(
            self.args, stdout=self.out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT
        )
        return self

    async def wait_for(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        with trio.fail_after(timeout):
            while (match := re.search(pattern, self.log.read_text())) is None:
                if self.process.poll() is not None:
                    raise AssertionError(f"{self.args[2]} exited: {self.log.read_text()}")
                await trio.sleep(0.05)
        return match

    async def __aexit__(self, *exc: object) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            with trio.move_on_after(10):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
        self.out.close()


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 120, 200)).save(out, format="PNG")
    return out.getvalue()


def _http(method: str, url: str, body: bytes | None = None, ctype: str = "") -> tuple[int, Any]:
    req = urllib.request.Request(url, data=body, method=method)
    if ctype:
        req.add_header("Content-Type", ctype)
    try:
        with urllib.request.urlopen(req, timeout=20) as resp:
            return resp.status, (resp.headers, resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, (exc.headers, exc.read())


async def test_flask_under_gunicorn_offloads_thumbnails_and_the_model(tmp_path: Path) -> None:
    sock = str(tmp_path / "dirty.sock")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    node_args = [
        sys.executable, "-m", "otp.node", "--app", "apps.dirty", "--dirty-app", EXAMPLE_APP,
        "--dirty-workers", "2", "--dirty-socket", sock, "--dirty-pidfile", sock + ".pid",
    ]  # fmt: skip
    web_args = [
        sys.executable, "-m", "gunicorn", "-w", "2", "-b", "127.0.0.1:0",
        "--chdir", str(ROOT / "examples" / "flask_dirty"), "app:app",
    ]  # fmt: skip
    async with Proc(tmp_path / "node.log", node_args, env) as node:
        await node.wait_for("is running")
        web_env = dict(env, GUNICORN_DIRTY_SOCKET=sock)
        async with Proc(tmp_path / "web.log", web_args, web_env) as web:
            port = (await web.wait_for(r"Listening at: http://127\.0\.0\.1:(\d+)")).group(1)
            await web.wait_for(r"Booting worker")
            base = f"http://127.0.0.1:{port}"

            def requests() -> None:
                status, (_, body) = _http("GET", f"{base}/")
                assert status == 200 and json.loads(body)["pillow"] is True
                worker_pid = json.loads(body)["pid"]
                assert worker_pid not in (node.process.pid, web.process.pid)

                status, (headers, body) = _http(
                    "POST", f"{base}/thumbnail?size=50", _png(300, 150), "image/png"
                )
                assert status == 200 and headers["Content-Type"] == "image/png"
                assert headers["X-Thumbnail-Size"] == "50x25"
                assert Image.open(io.BytesIO(body)).size == (50, 25)

                status, (_, body) = _http("POST", f"{base}/thumbnail", b"not an image")
                assert status == 422 and "not an image" in json.loads(body)["error"]

                text = json.dumps({"text": "great great food, terrible service"}).encode()
                status, (_, body) = _http("POST", f"{base}/predict", text, "application/json")
                answer = json.loads(body)
                assert status == 200
                assert answer["prediction"]["label"] == "positive"
                assert answer["prediction"]["words"] == ["great", "great", "terrible"]
                assert answer["counts"] == {
                    "total": 5,
                    "top": [["great", 2], ["food", 1], ["service", 1]],
                }

                status, (_, body) = _http("GET", f"{base}/count?n=5")
                assert status == 200 and body == b"0\n1\n2\n3\n4\n"

            await trio.to_thread.run_sync(requests)


def _flask_app() -> Any:
    pytest.importorskip("flask")
    spec = importlib.util.spec_from_file_location(
        "flask_dirty_app_under_test", ROOT / "examples" / "flask_dirty" / "app.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.app


@pytest.fixture
async def web(start_pool: Any, socket_path: str) -> Any:
    """The example Flask app's test client, against a pool hosting the example app."""
    pytest.importorskip("PIL")
    app = _flask_app()
    await start_pool(dirty_apps=[EXAMPLE_APP], dirty_workers=1)
    assert dirty.get_dirty_socket_path() == socket_path
    try:
        yield app.test_client()
    finally:
        dirty.close_dirty_client()


async def _req(client: Any, method: str, url: str, **kw: Any) -> Any:
    def go() -> Any:
        resp = client.open(url, method=method, **kw)
        return resp.status_code, resp.get_data()

    with trio.fail_after(20):
        return await trio.to_thread.run_sync(go)


async def test_web_thumbnail_bad_inputs_are_client_errors(web: Any) -> None:
    status, body = await _req(web, "POST", "/thumbnail", data=b"")
    assert status == 422 and "not an image" in json.loads(body)["error"]
    status, body = await _req(web, "POST", "/thumbnail?size=0", data=_png(10, 10))
    assert status == 422 and "size" in json.loads(body)["error"]
    status, body = await _req(web, "POST", "/thumbnail?size=-3", data=_png(10, 10))
    assert status == 422
    # a huge size does not enlarge: the image already fits
    status, body = await _req(web, "POST", "/thumbnail?size=100000", data=_png(30, 20))
    assert status == 200 and body.startswith(b"\x89PNG")


async def test_web_thumbnail_absurd_size_is_a_client_error_not_a_500(web: Any) -> None:
    """``size`` is a query parameter: a 30-digit number is bad input, so a 4xx."""
    status, _ = await _req(web, "POST", "/thumbnail?size=" + "9" * 30, data=_png(10, 10))
    assert 400 <= status < 500


async def test_web_predict_with_non_object_json_is_a_400(web: Any) -> None:
    """A JSON body that is not an object (a list, a string) is bad input: 400, not a 500."""
    for body in (b'["a great day"]', b'"a great day"', b"42"):
        status, _ = await _req(web, "POST", "/predict", data=body, content_type="application/json")
        assert status == 400, body


async def test_web_predict_empty_and_wrong_bodies_are_400(web: Any) -> None:
    for kw in (
        {"data": b""},
        {"data": b"{not json", "content_type": "application/json"},
        {"data": b'{"text": 5}', "content_type": "application/json"},
    ):
        status, body = await _req(web, "POST", "/predict", **kw)
        assert status == 400 and "text" in json.loads(body)["error"]


async def test_web_count_negative_and_bad_n(web: Any) -> None:
    status, body = await _req(web, "GET", "/count?n=-4")
    assert status == 200 and body == b""
    status, body = await _req(web, "GET", "/count?n=abc")  # Flask: the default, 10
    assert status == 200 and body == b"".join(f"{i}\n".encode() for i in range(10))


async def test_web_count_absurd_n_is_a_client_error(web: Any) -> None:
    status, _ = await _req(web, "GET", "/count?n=" + "9" * 30)
    assert 400 <= status < 500
