"""Edges of the dirty pool as users really use it: the README's node command, the example web
app's endpoints with bad input, the bundled example app with bad arguments, and the stash under
contention and at the protocol's limits. Real worker processes (``start_pool``)."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from apps import dirty
from apps.dirty import _stash
from apps.dirty.examples import EXAMPLE_APP
from otp import ets

from .conftest import ECHO

ROOT = Path(__file__).resolve().parents[3]
HERE = "tests.test_apps.test_dirty.test_edges_real_use"
STASHER = f"{HERE}:ContendApp"


class ContendApp(dirty.DirtyApp):
    """Stash work done from inside dirty workers, to race with web clients."""

    def bump(self, table: str, key: str, n: int) -> int:
        from apps.dirty import stash

        last = 0
        for _ in range(n):
            last = stash.update_counter(table, key)
        return last

    def cas_bump(self, table: str, key: str, n: int) -> int:
        from apps.dirty import stash

        retries = 0
        for _ in range(n):
            while True:
                current = stash.get(table, key, 0)
                if stash.compare_and_set(table, key, current, current + 1):
                    break
                retries += 1
        return retries

    def pid(self) -> int:
        return os.getpid()

    def put_then_hang(self, table: str, wait: float) -> None:
        import time

        from apps.dirty import stash

        stash.put(table, "before", 1)
        time.sleep(wait)


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (1, 2, 3)).save(out, format="PNG")
    return out.getvalue()


# ------------------------------------------------------------------ README's node command


async def test_readme_node_command_serves_the_example_app_on_the_printed_socket(
    tmp_path: Path,
) -> None:
    """``python -m otp.node`` (no arguments): the banner's GUNICORN_DIRTY_SOCKET line names a
    socket that answers the bundled example app's actions, and its declared stash exists."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    env.pop("GUNICORN_DIRTY_SOCKET", None)
    log = tmp_path / "node.log"
    with open(log, "wb") as out:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "otp.node"], stdout=out, stderr=subprocess.STDOUT, env=env,
            cwd=ROOT,
        )  # fmt: skip
        try:
            with trio.fail_after(30):
                while (
                    m := re.search(r"export GUNICORN_DIRTY_SOCKET=(\S+)", log.read_text())
                ) is None:
                    assert proc.poll() is None, log.read_text()
                    await trio.sleep(0.05)
                while "is running" not in log.read_text():
                    assert proc.poll() is None, log.read_text()
                    await trio.sleep(0.05)
            sock = m.group(1)
            assert sock.startswith(str(tmp_path)) and Path(sock).exists()

            def use() -> None:
                with dirty.DirtyClient(sock, timeout=20) as client:
                    assert client.execute(EXAMPLE_APP, "upper", "hi") == "HI"
                    got = client.execute(EXAMPLE_APP, "predict", "a great, lovely day")
                    assert got["label"] == "positive"
                    assert list(client.stream(EXAMPLE_APP, "count", 3)) == [0, 1, 2]
                    info = client.execute(EXAMPLE_APP, "info")
                    assert info["pid"] != proc.pid and info["app"] == EXAMPLE_APP
                    assert "examples" in dirty.stash.StashClient(client).tables()

            await trio.to_thread.run_sync(use)
        finally:
            proc.terminate()
            with trio.move_on_after(15):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


# --------------------------------------------------------------- the example web app


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


# ------------------------------------------------------- the example app, bad arguments


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


# ----------------------------------------------------------------- stash under contention


async def test_stash_counters_from_threads_and_workers_lose_no_update(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[STASHER], dirty_workers=2)
    threads, per = 6, 40

    def web_side(shared: dirty.DirtyClient) -> None:
        own = dirty.DirtyClient(socket_path, timeout=20)
        s_own, s_shared = dirty.stash.StashClient(own), dirty.stash.StashClient(shared)
        errors: list[BaseException] = []

        def run(i: int) -> None:
            try:
                s = s_own if i % 2 else s_shared
                for _ in range(per):
                    s.update_counter("cnt", "hits", 1)
                    s.update_counter("cnt", ("by", i), 2)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        def in_workers() -> None:
            try:
                for _ in range(2):
                    shared.execute(STASHER, "bump", "cnt", "hits", per)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        ts += [threading.Thread(target=in_workers) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert not errors, errors
        total = threads * per + 4 * per
        assert s_shared.get("cnt", "hits") == total
        for i in range(threads):
            assert s_shared.get("cnt", ["by", i]) == 2 * per
        assert s_shared.info("cnt")["size"] == 1 + threads
        own.close()

    shared = dirty.DirtyClient(socket_path, timeout=20)
    with trio.fail_after(60):
        await trio.to_thread.run_sync(web_side, shared)
    shared.close()


async def test_stash_cas_and_insert_new_races(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[STASHER], dirty_workers=2)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)
    per, threads = 25, 4

    def race() -> None:
        s.put("race", "cas", 0)
        wins: list[int] = []
        errors: list[BaseException] = []

        def cas(i: int) -> None:
            try:
                for _ in range(per):
                    while True:
                        current = s.get("race", "cas", 0)
                        if s.compare_and_set("race", "cas", current, current + 1):
                            break
                if s.insert_new("race", "once", i):
                    wins.append(i)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        def worker() -> None:
            try:
                client.execute(STASHER, "cas_bump", "race", "cas", per)
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        ts = [threading.Thread(target=cas, args=(i,)) for i in range(threads)]
        ts += [threading.Thread(target=worker) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        assert not errors, errors
        assert s.get("race", "cas") == (threads + 2) * per
        assert len(wins) == 1 and s.get("race", "once") == wins[0]

    with trio.fail_after(60):
        await trio.to_thread.run_sync(race)
    client.close()


async def test_stash_keys_pattern_while_others_write(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        stop = threading.Event()
        errors: list[BaseException] = []

        def writer(w: int) -> None:
            try:
                for i in range(150):
                    s.put("kp", f"user:{w}:{i}", i)
                    s.put("kp", f"other:{w}:{i}", i)
                    if i % 3 == 0:
                        s.delete("kp", f"user:{w}:{i}")
            except BaseException as exc:  # pragma: no cover
                errors.append(exc)

        def reader() -> None:
            try:
                while not stop.is_set():
                    for key in s.keys("kp", "user:*"):
                        assert isinstance(key, str) and key.startswith("user:")
            except BaseException as exc:
                errors.append(exc)

        ws = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        r = threading.Thread(target=reader)
        r.start()
        for t in ws:
            t.start()
        for t in ws:
            t.join(30)
        stop.set()
        r.join(30)
        assert not errors, errors
        users = s.keys("kp", "user:*")
        assert len(users) == 3 * 100 and len(s.keys("kp")) == 3 * 250

    with trio.fail_after(60):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_ttl_expiry_while_counters_run(start_pool: Any, socket_path: str) -> None:
    """A short-lived lock taken with insert_new(ttl) expires under concurrent traffic, and the
    next insert_new wins exactly once."""
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        assert s.insert_new("ttlc", "lock", "a", ttl=0.3) is True
        stop = threading.Event()

        def noise() -> None:
            while not stop.is_set():
                s.update_counter("ttlc", "n")
                s.exists("ttlc", "lock")

        t = threading.Thread(target=noise)
        t.start()
        try:
            assert s.insert_new("ttlc", "lock", "b") is False
            deadline = threading.Event()
            while s.exists("ttlc", "lock"):
                deadline.wait(0.02)
            assert s.get("ttlc", "lock", "gone") == "gone"
            wins = [s.insert_new("ttlc", "lock", i) for i in range(5)]
            assert wins == [True, False, False, False, False]
            assert s.get("ttlc", "lock") == 0
        finally:
            stop.set()
            t.join(10)

    with trio.fail_after(20):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_worker_killed_mid_action_leaves_table_usable(
    start_pool: Any, socket_path: str
) -> None:
    import signal

    await start_pool(dirty_apps=[STASHER], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    async def hang() -> None:
        with pytest.raises(dirty.DirtyError):
            await client.execute_async(STASHER, "put_then_hang", "killed", 30)

    with trio.fail_after(30):
        pid = await client.execute_async(STASHER, "pid")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(hang)
            while not await trio.to_thread.run_sync(s.exists, "killed", "before"):
                await trio.sleep(0.02)
            os.kill(pid, signal.SIGKILL)
        assert await trio.to_thread.run_sync(s.get, "killed", "before") == 1
        assert await trio.to_thread.run_sync(s.update_counter, "killed", "n") == 1
        while True:  # the supervisor starts a replacement worker
            try:
                new_pid = await client.execute_async(STASHER, "pid")
                break
            except dirty.DirtyNoWorkersAvailableError:
                await trio.sleep(0.05)
        assert new_pid != pid
        assert await client.execute_async(STASHER, "bump", "killed", "n", 3) == 4
        assert await trio.to_thread.run_sync(s.info, "killed") == {"size": 2, "table": "killed"}
    await client.close_async()
    client.close()


# ------------------------------------------------------------ stash at the protocol limits


async def test_stash_large_and_nested_values_round_trip(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=30)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        big = os.urandom(8 << 20)
        s.put("lim", "big", big)
        assert s.get("lim", "big") == big
        nested: Any = "leaf"
        for i in range(100):
            nested = {"level": i, "child": [nested, b"x", None, 1.5, -(2**63)]}
        s.put("lim", "nested", nested)
        assert s.get("lim", "nested") == nested
        many = {f"k{i}": i for i in range(20000)}
        s.put("lim", "many", many)
        assert s.get("lim", "many") == many
        for key in (b"bytes-key", 7, -1.25, ("t", 1)):
            s.put("lim", key, repr(key))
            assert s.get("lim", key) == repr(key)

    with trio.fail_after(60):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_too_large_value_is_a_typed_error_and_client_still_works(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=30)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        with pytest.raises(dirty.DirtyProtocolError):
            s.put("lim2", "huge", b"\0" * (65 << 20))
        assert not s.exists("lim2", "huge")
        s.put("lim2", "ok", 1)
        assert s.get("lim2", "ok") == 1

    with trio.fail_after(60):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_too_deep_value_is_a_stash_error_and_the_connection_survives(
    start_pool: Any, socket_path: str
) -> None:
    """A value nested deeper than the protocol allows is refused for that call only: other
    calls sharing the client's connection go on."""
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        s.put("deep", "before", 1)
        deep: Any = 0
        for _ in range(400):
            deep = [deep]
        with pytest.raises(dirty.DirtyProtocolError):
            s.put("deep", "v", deep)
        assert s.get("deep", "before") == 1
        assert not s.exists("deep", "v")

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_unhashable_and_bad_keys_are_stash_errors(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        for key in ({"a": 1}, ["nested", {"b": 2}]):
            for op in (
                lambda k: s.put("bk", k, 1),
                lambda k: s.get("bk", k),
                lambda k: s.update_counter("bk", k),
                lambda k: s.insert_new("bk", k, 1),
                lambda k: s.compare_and_set("bk", k, dirty.stash.ABSENT, 1),
                lambda k: s.exists("bk", k),
                lambda k: s.delete("bk", k),
            ):
                with pytest.raises(dirty.StashError):
                    op(key)
        assert s.keys("bk") == []
        s.put("bk", "fine", 1)
        assert s.keys("bk") == ["fine"]

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_cas_compares_types_exactly(start_pool: Any, socket_path: str) -> None:
    """compare_and_set(expected=1) must not match a stored True (nor 1.0): the wire keeps
    them apart, so a CAS must too."""
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        s.put("cas_t", "flag", True)
        assert s.compare_and_set("cas_t", "flag", 1, "swapped") is False
        s.put("cas_t", "f", 1.0)
        assert s.compare_and_set("cas_t", "f", 1, "swapped") is False

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_bad_table_names(start_pool: Any, socket_path: str) -> None:
    await start_pool(dirty_apps=[ECHO], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        for name in (123, None, b"bytes"):
            with pytest.raises((dirty.StashError, dirty.DirtyProtocolError)):
                s.put(name, "k", 1)  # type: ignore[arg-type]
        assert s.get("echo_table", "x", "d") == "d"  # the connection still works
        assert all(isinstance(t, str) for t in s.tables())

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_unencodable_arguments_and_values_are_typed_dirty_errors(
    start_pool: Any, socket_path: str
) -> None:
    """Gunicorn's client raises DirtyProtocolError for a value TLV cannot carry; web apps
    catch DirtyError (as examples/flask_dirty does), so an untyped ValueError becomes a 500."""
    await start_pool(dirty_apps=[ECHO], dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        deep: Any = 0
        for _ in range(300):
            deep = [deep]
        for bad in ({1, 2}, object(), 2**64, deep):
            with pytest.raises(dirty.DirtyError):
                client.execute(ECHO, "echo", bad)
            with pytest.raises(dirty.DirtyError):
                s.put("enc", "k", bad)
        assert client.execute(ECHO, "echo", "still fine") == "still fine"

    with trio.fail_after(30):
        await trio.to_thread.run_sync(go)
    client.close()


async def test_stash_keys_refuses_a_pattern_over_its_length_limit(
    start_pool: Any, socket_path: str
) -> None:
    # A 256K-character glob held the node's loop for seconds (and stayed compiled in a cache).
    await start_pool(dirty_workers=1)
    client = dirty.DirtyClient(socket_path, timeout=20)
    s = dirty.stash.StashClient(client)

    def go() -> None:
        s.put("long", "a" * 10, 1)
        assert s.keys("long", "a" * 1024) == []  # the limit itself is accepted
        assert s.keys("long", "a" + "*" * 1023) == ["a" * 10]
        for pattern in ("*" * 1025, "a" * (256 << 10)):
            with pytest.raises(dirty.StashError, match="MAX_PATTERN=1024"):
                s.keys("long", pattern)
        with pytest.raises(dirty.StashError, match="MAX_PATTERN"):
            s.keys("no-such-table", "*" * 2000)  # refused whether or not the table exists

    try:
        with trio.fail_after(30):
            await trio.to_thread.run_sync(go)
    finally:
        client.close()


async def test_a_long_stash_keys_scan_lets_the_nodes_other_tasks_run(
    start_pool: Any, socket_path: str
) -> None:
    # Each key costs the glob microseconds; 300,000 of them took the node's loop for the whole
    # scan. Sliced, the node's other tasks run between slices: a task of the node that ticks
    # as often as it is let run never waits anywhere near the scan's length. (How many other
    # clients' calls get through meanwhile depends on the machine's load; the longest gap
    # between ticks does not, against the scan's own length.)
    await start_pool(dirty_workers=1)
    scanner = dirty.DirtyClient(socket_path, timeout=60)
    s = dirty.stash.StashClient(scanner)
    await trio.to_thread.run_sync(s.ensure, "scan")
    # (Filled from inside the node, where this test runs: 300,000 puts over the socket are slow.)
    ets.insert(_stash._ets_name("scan"), [("a" * 150 + str(i), i) for i in range(300_000)])
    pattern = "*a" * 60 + "*b"  # no key matches: every key is tried to its end
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.perf_counter()
        while True:
            await trio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    def scan() -> tuple[int, float]:
        t0 = time.perf_counter()
        found = s.keys("scan", pattern)
        return len(found), time.perf_counter() - t0

    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(ticker)
                found, took = await trio.to_thread.run_sync(scan)
                nursery.cancel_scope.cancel()
    finally:
        scanner.close()
    assert found == 0
    assert took > 0.05, f"the scan took {took:.3f}s: too short to tell slicing from blocking"
    assert max(gaps) < took / 3, f"the node's loop stalled {max(gaps):.3f}s of a {took:.3f}s scan"
