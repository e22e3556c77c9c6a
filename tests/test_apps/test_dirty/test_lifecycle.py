"""Hooks, log reopening, per-request timeouts, PID-file orphan cleanup, STATUS heartbeats: a real
pool in the test's node, with real worker processes."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import supervisors
from apps import dirty
from apps.dirty import _lifecycle, _pidfile

from .conftest import ECHO

LOG = "tests.test_apps.test_dirty.dirty_apps:LogApp"
HOOKS = "tests.test_apps.test_dirty.dirty_hooks"
#: The module as the pool loads it (by path), not as pytest imported this package.
dirty_hooks: Any = importlib.import_module(HOOKS)


async def _wait_until(predicate: Any, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_the_four_hooks_run_where_and_when_gunicorn_runs_them(
    start_pool: Any, socket_path: str
) -> None:
    dirty_hooks.CALLS.clear()
    hooks = {name: f"{HOOKS}:{name}" for name in _hook_names()}
    await start_pool(dirty_apps=[LOG], dirty_workers=2, hooks=hooks)
    client = dirty.DirtyClient(socket_path)
    status = await client.status_async()
    pids = sorted(w["pid"] for w in status["workers"])
    kinds = [c[0] for c in dirty_hooks.CALLS]
    assert kinds == ["on_dirty_starting", "dirty_post_fork", "dirty_post_fork"]
    assert dirty_hooks.CALLS[0][1] == socket_path
    forked = [c[1] for c in dirty_hooks.CALLS[1:]]
    assert sorted(i.pid for i in forked) == pids and {i.apps for i in forked} == {(LOG,)}
    # dirty_worker_init ran inside each worker, after its apps loaded.
    marks = set()
    for _ in range(6):
        marks.add(await client.execute_async(LOG, "env", "DIRTY_TEST_INIT"))
    assert marks == {f"{i.worker_id}:{i.pid}:{LOG}" for i in forked}
    await client.close_async()
    await supervisors.stop_application("dirty")
    exited = [c[1] for c in dirty_hooks.CALLS if c[0] == "dirty_worker_exit"]
    assert sorted(i.pid for i in exited) == pids


def _hook_names() -> list[str]:
    return ["on_dirty_starting", "dirty_post_fork", "dirty_worker_init", "dirty_worker_exit"]


def test_hooks_are_found_by_name_in_the_dirty_config_module() -> None:
    config = dirty.DirtyConfig.from_settings(
        {"dirty": {"dirty_apps": [ECHO], "dirty_workers": 1, "dirty_config": HOOKS}}
    )
    for name in _hook_names():
        assert config.hook(name) is getattr(dirty_hooks, name)


async def test_usr1_reopens_log_files_in_the_node_and_the_workers(
    start_pool: Any, socket_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker_log = tmp_path / "worker.log"
    node_log = tmp_path / "node.log"
    monkeypatch.setenv("DIRTY_TEST_WORKER_LOG", str(worker_log))
    handler = logging.FileHandler(node_log)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        await start_pool(
            dirty_apps=[LOG],
            dirty_workers=1,
            handle_signals=True,
            hooks={"dirty_worker_init": f"{HOOKS}:dirty_worker_init"},
        )
        client = dirty.DirtyClient(socket_path)
        await client.execute_async(LOG, "log", "before")
        logging.getLogger("dirty.test").warning("node before")
        # logrotate moves the files away, then sends USR1.
        worker_log.rename(tmp_path / "worker.log.1")
        node_log.rename(tmp_path / "node.log.1")
        os.kill(os.getpid(), signal.SIGUSR1)
        n = 0

        async def reopened() -> bool:
            nonlocal n
            n += 1
            await client.execute_async(LOG, "log", f"after {n}")
            logging.getLogger("dirty.test").warning("node after %d", n)
            return worker_log.exists() and node_log.exists()

        with trio.fail_after(10):
            while not await reopened():
                await trio.sleep(0.02)
        assert "before" in (tmp_path / "worker.log.1").read_text()
        assert "after" in worker_log.read_text() and "before" not in worker_log.read_text()
        assert "node after" in node_log.read_text()
        await client.close_async()
    finally:
        root.removeHandler(handler)
        handler.close()


async def test_a_request_over_its_timeout_always_gets_dirty_timeout_error(
    start_pool: Any, socket_path: str
) -> None:
    """Blocked in a thread, blocking the worker's loop, stalled mid-stream, queued behind a
    slow call: every call over dirty_timeout gets DirtyTimeoutError, never another error."""
    await start_pool(dirty_apps=[LOG], dirty_workers=2, dirty_threads=2, dirty_timeout=0.5)
    client = dirty.DirtyClient(socket_path, timeout=20)
    outcomes: list[Any] = []

    async def call(action: str, *args: Any) -> None:
        try:
            if action == "stall_stream":
                outcomes.append([x async for x in client.stream_async(LOG, action, *args)])
            else:
                outcomes.append(await client.execute_async(LOG, action, *args))
        except dirty.DirtyError as exc:
            outcomes.append(exc)

    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            for action in ("sleep", "async_block", "stall_stream", "sleep", "sleep", "sleep"):
                nursery.start_soon(call, action, 3.0)
    assert len(outcomes) == 6
    assert all(type(o) is dirty.DirtyTimeoutError for o in outcomes), outcomes
    assert all(o.timeout == 0.5 for o in outcomes)
    # The pool replaced the killed workers and serves again.
    with trio.fail_after(10):
        while len((await client.status_async())["workers"]) < 2:
            await trio.sleep(0.05)
    assert await client.execute_async(LOG, "sleep", 0.01) == 0.01
    await client.close_async()


async def test_status_reports_seconds_since_each_workers_last_heartbeat(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_workers=2, dirty_timeout=0.4)  # a heartbeat every 0.1 s
    client = dirty.DirtyClient(socket_path)
    await trio.sleep(0.3)
    workers = (await client.status_async())["workers"]
    assert len(workers) == 2
    for w in workers:
        assert isinstance(w["last_heartbeat"], float) and 0 <= w["last_heartbeat"] < 0.4
    await client.close_async()


# The PID file: a restarted pool kills the orphans of its previous life, owner-checked.


async def _fake_orphan() -> trio.Process:
    """A process of ours whose command line is a dirty worker's, as an orphan's would be."""
    return await trio.lowlevel.open_process(
        [sys.executable, "-c", "import time; time.sleep(60)", "apps.dirty.worker"]
    )


async def _dead_pid() -> int:
    proc = await trio.lowlevel.open_process([sys.executable, "-c", "pass"])
    await proc.wait()
    return proc.pid


async def test_a_restarted_pool_kills_the_orphans_its_previous_life_left(
    start_pool: Any, socket_path: str
) -> None:
    orphan = await _fake_orphan()
    bystander = await trio.lowlevel.open_process(["sleep", "60"])  # ours, not a worker
    pidfile = socket_path + ".pid"
    Path(pidfile).write_text(f"{await _dead_pid()}\n{orphan.pid}\n{bystander.pid}\n")
    try:
        await start_pool(dirty_workers=1)
        with trio.fail_after(5):
            assert await orphan.wait() == -signal.SIGKILL
        assert bystander.poll() is None
        client = dirty.DirtyClient(socket_path)
        workers = [w["pid"] for w in (await client.status_async())["workers"]]
        listed = _pidfile.read_pidfile(pidfile)
        assert listed[0] == os.getpid() and listed[1:] == workers
        await client.close_async()
    finally:
        for proc in (orphan, bystander):
            if proc.poll() is None:
                proc.kill()
            await proc.wait()
    await supervisors.stop_application("dirty")
    assert not Path(pidfile).exists()  # a clean stop removes it


@pytest.mark.parametrize("case", ["writable_by_others", "previous_node_still_running"])
async def test_an_untrusted_pid_file_or_a_live_pool_kills_nothing(
    start_pool: Any, socket_path: str, case: str
) -> None:
    orphan = await _fake_orphan()
    live_node = await trio.lowlevel.open_process(["sleep", "60"])
    pidfile = Path(socket_path + ".pid")
    if case == "writable_by_others":
        pidfile.write_text(f"{await _dead_pid()}\n{orphan.pid}\n")
        pidfile.chmod(0o666)
    else:
        pidfile.write_text(f"{live_node.pid}\n{orphan.pid}\n")
        pidfile.chmod(0o600)
    try:
        await start_pool(dirty_workers=1)
        client = dirty.DirtyClient(socket_path)
        assert await client.execute_async(ECHO, "echo", 1) == 1
        assert orphan.poll() is None
        if case == "previous_node_still_running":  # its file is left to it
            assert _pidfile.read_pidfile(str(pidfile)) == [live_node.pid, orphan.pid]
        await client.close_async()
    finally:
        for proc in (orphan, live_node):
            proc.kill()
            await proc.wait()


ORDER = "tests.test_apps.test_dirty.dirty_apps:OrderApp"
TOGETHER = "tests.test_apps.test_dirty.dirty_apps:TogetherApp"
FLAKY = "tests.test_apps.test_dirty.dirty_apps:FlakyLoadApp"


async def test_a_worker_starts_in_gunicorns_order_post_fork_init_then_worker_init(
    start_pool: Any, socket_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fork -> dirty_post_fork -> every app's __init__ -> every init() -> dirty_worker_init,
    as the worker sees it: the node's hook has run before the worker builds its apps."""
    order = tmp_path / "order"
    monkeypatch.setenv("DIRTY_TEST_ORDER", str(order))
    hooks = {
        "dirty_post_fork": f"{HOOKS}:note_post_fork",
        "dirty_worker_init": f"{HOOKS}:note_worker_init",
    }
    await start_pool(dirty_apps=[ORDER, LOG], dirty_workers=2, hooks=hooks)
    client = dirty.DirtyClient(socket_path)
    pids = {w["pid"] for w in (await client.status_async())["workers"]}
    await client.close_async()
    events: dict[int, list[str]] = {pid: [] for pid in pids}
    for line in order.read_text().splitlines():
        event, pid = line.split()
        events[int(pid)].append(event)
    assert events == {
        pid: ["dirty_post_fork", "__init__", "init", "dirty_worker_init"] for pid in pids
    }


async def test_disabled_pool_with_no_apps_and_zero_workers_says_so_once(
    start_pool: Any, socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="apps.dirty")
    await start_pool(dirty_apps=[], dirty_workers=0)
    disabled = [r.getMessage() for r in caplog.records if "disabled" in r.getMessage()]
    assert disabled == ["dirty pool disabled: dirty_workers = 0 and no dirty_apps"]
    assert not os.path.exists(socket_path)  # nothing listens, no worker runs
    await supervisors.stop_application("dirty")


async def test_workers_load_their_apps_in_parallel_bounded_by_the_load_timeout(
    start_pool: Any, socket_path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker's init() waits until all three are in init(): one after another, the pool
    could never start. dirty_timeout (1 s) does not bound the load; dirty_app_load_timeout
    does."""
    folder = tmp_path / "together"
    folder.mkdir()
    monkeypatch.setenv("DIRTY_TEST_TOGETHER", str(folder))
    monkeypatch.setenv("DIRTY_TEST_WORKERS", "3")
    with trio.fail_after(60):
        await start_pool(
            dirty_apps=[TOGETHER], dirty_workers=3, dirty_timeout=1.0, dirty_app_load_timeout=30.0
        )
    client = dirty.DirtyClient(socket_path)
    status = await client.status_async()
    assert sorted(w["pid"] for w in status["workers"]) == sorted(map(int, os.listdir(folder)))
    assert await client.execute_async(TOGETHER, "pid") in {w["pid"] for w in status["workers"]}
    await client.close_async()


async def test_a_failed_load_is_logged_with_the_apps_traceback_and_retried_by_the_pool(
    start_pool: Any,
    socket_path: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("DIRTY_TEST_FLAKY", str(tmp_path / "flaky"))
    await start_pool(dirty_apps=[FLAKY], dirty_workers=1)  # (the start does not fail)
    client = dirty.DirtyClient(socket_path)
    [worker] = (await client.status_async())["workers"]
    assert await client.execute_async(FLAKY, "pid") == worker["pid"]
    await client.close_async()
    [failure] = [r.getMessage() for r in caplog.records if "failed to start" in r.getMessage()]
    assert "FlakyLoadApp failed to load: RuntimeError: the model file is not there yet" in failure
    assert "Traceback (most recent call last)" in failure and "in init" in failure


async def test_a_load_is_logged_while_it_lasts_and_given_up_at_the_load_timeout(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The node's side of a worker's boot, on trio's clock: the test plays the worker."""
    caplog.set_level(logging.INFO, logger="apps.dirty")
    ours, theirs = trio.socket.socketpair()
    stream = trio.SocketStream(ours)
    worker = trio.SocketStream(theirs)

    async def boot() -> None:
        await worker.send_all(_lifecycle.loading_notice("myapp:MLApp"))
        await trio.sleep(70)  # the model loads for 70 s

    async with trio.open_nursery() as nursery:
        nursery.start_soon(boot)
        with pytest.raises(dirty.DirtyWorkerError, match="dirty_app_load_timeout=100s"):
            await _lifecycle.await_loaded(stream, 2, ("myapp:Tokenizer", "myapp:MLApp"), 100.0)
    progress = [r.getMessage() for r in caplog.records if "loading" in r.getMessage()]
    assert progress[:3] == [
        "dirty worker 2 loading myapp:MLApp, 25 s",
        "dirty worker 2 loading myapp:MLApp, 50 s",
        "dirty worker 2 loading myapp:MLApp, 75 s",
    ]
    await stream.aclose()
    await worker.aclose()
