"""The pool's lifecycle: signals to the node and to workers (TERM/INT drain, HUP, TTIN/TTOU),
worker replacement (crash, max_requests), hooks, log reopening, per-request timeouts, parent-death
detection, PID-file orphan cleanup, STATUS heartbeats. Real worker processes."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import supervisors
from apps import dirty
from apps.dirty import _lifecycle, _pidfile

from .conftest import ECHO, LIMITED
from .helpers import ROOT, _env

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


async def test_dirty_timeout_does_not_count_time_queued_behind_busy_threads(
    start_pool: Any, socket_path: str
) -> None:
    """dirty_threads=1: four 0.4 s calls run one after another in the worker. None runs
    anywhere near dirty_timeout=1 s, so none may time out and the worker must not be killed."""
    await start_pool(dirty_workers=1, dirty_threads=1, dirty_timeout=1.0)
    client = dirty.DirtyClient(socket_path, timeout=10)
    before = [w["pid"] for w in (await client.status_async())["workers"]]
    outcomes: list[Any] = []

    async def call() -> None:
        try:
            outcomes.append(await client.execute_async(ECHO, "sleep", 0.4))
        except dirty.DirtyError as exc:
            outcomes.append(type(exc).__name__)

    try:
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(call)
        assert outcomes == [0.4] * 4
        assert [w["pid"] for w in (await client.status_async())["workers"]] == before
    finally:
        await client.close_async()


async def test_dirty_timeout_counts_from_when_a_queued_call_starts(
    start_pool: Any, socket_path: str
) -> None:
    """dirty_threads=1: a call queued behind a 0.3 s call is exempt while it waits, and timed
    from when its thread takes it: stuck there, it still gets the worker killed."""
    await start_pool(dirty_workers=1, dirty_threads=1, dirty_timeout=1.0)
    client = dirty.DirtyClient(socket_path, timeout=20)
    before = [w["pid"] for w in (await client.status_async())["workers"]]
    outcomes: dict[str, Any] = {}

    async def call(name: str, seconds: float) -> None:
        try:
            outcomes[name] = await client.execute_async(ECHO, "sleep", seconds)
        except dirty.DirtyError as exc:
            outcomes[name] = exc

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "first", 0.3)
                await trio.sleep(0.05)
                nursery.start_soon(call, "stuck", 30.0)
        assert outcomes["first"] == 0.3
        assert isinstance(outcomes["stuck"], dirty.DirtyTimeoutError)
        with trio.fail_after(10):
            while [w["pid"] for w in (await client.status_async())["workers"]] in ([], before):
                await trio.sleep(0.05)
    finally:
        await client.close_async()


GATED = "tests.test_apps.test_dirty.dirty_apps:GatedApp"
MARK = "tests.test_apps.test_dirty.dirty_apps:MarkApp"


def _state(pid: int) -> str:
    """The process's state letter; "Z" once it is gone (or a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def _exited(pid: int) -> bool:
    return _state(pid) == "Z"


def _children(pid: int) -> list[int]:
    """OS pids of the live dirty worker processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid and b"apps.dirty.worker" in cmdline:
            out.append(int(entry.name))
    return out


async def _until(predicate: Callable[[], Any], timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.02)


class Node:
    """``python -m otp.node --app apps.dirty ...`` in its own OS process (and, with
    ``session``, its own session: a process group to send a terminal's Ctrl-C to)."""

    def __init__(
        self, tmp: Path, *args: str, session: bool = False, wait: bool = True, **env: str
    ) -> None:
        self.socket = str(tmp / "pool.sock")
        self.pidfile = tmp / "pool.pid"
        self.log = tmp / f"node-{len(list(tmp.glob('node-*.log')))}.log"
        self.args = [
            sys.executable, "-m", "otp.node", "--log-level", "info", "--app", "apps.dirty",
            "--dirty-socket", self.socket, "--dirty-pidfile", str(self.pidfile), *args,
        ]  # fmt: skip
        self.session = session
        self.wait = wait
        self.env = env
        self._process: trio.Process | None = None

    @property
    def process(self) -> trio.Process:
        assert self._process is not None
        return self._process

    async def __aenter__(self) -> Node:
        self.out = open(self.log, "wb")
        self._process = await trio.lowlevel.open_process(
            self.args,
            stdout=self.out,
            stderr=subprocess.STDOUT,
            env=_env(**self.env),
            cwd=ROOT,
            start_new_session=self.session,
        )
        if self.wait:
            await self.wait_for("is running")
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_for(self, text: str, timeout: float = 20) -> None:
        with trio.fail_after(timeout):
            while text not in self.text():
                if self.process.poll() is not None:
                    raise AssertionError(f"node exited: {self.text()[-3000:]}")
                await trio.sleep(0.05)

    async def __aexit__(self, *exc: object) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        self.out.close()


async def _holding(
    nursery: trio.Nursery, client: dirty.DirtyClient, marks: list[Path], seconds: float
) -> list[Any]:
    """Start one MarkApp ``hold`` call per mark (``seconds`` long) and return once every one
    runs (one on each worker); the list gets each call's result or error as it ends."""
    results: list[Any] = []

    async def hold(mark: Path) -> None:
        try:
            results.append(await client.execute_async(MARK, "hold", str(mark), seconds))
        except dirty.DirtyError as exc:
            results.append(exc)

    for mark in marks:
        nursery.start_soon(hold, mark)
    await _until(lambda: all(m.exists() for m in marks))
    return results


async def _status(client: dirty.DirtyClient) -> dict[str, Any]:
    return await client.status_async()


async def _settled(
    client: dirty.DirtyClient, n: int, avoid: frozenset[int] | set[int] = frozenset()
) -> dict[str, Any]:
    """The status once exactly ``n`` workers serve, none draining and none of ``avoid``, and
    the pool's target is ``n`` (the router counts a started worker once its start is reported,
    which may come just after the worker announced itself). The bound is generous: replacing
    workers starts Python processes, which takes tens of seconds on a loaded machine."""
    with trio.fail_after(60):
        while True:
            status = await _status(client)
            pids = {w["pid"] for w in status["workers"]}
            if (
                len(status["workers"]) == n == status["target_workers"]
                and not any(w["draining"] for w in status["workers"])
                and not pids & avoid
                and all(w["pid"] for w in status["workers"])
            ):
                return status
            await trio.sleep(0.03)


def _layout(status: dict[str, Any]) -> list[list[str]]:
    """Each worker's apps, in worker order (oldest first)."""
    return [sorted(w["apps"]) for w in sorted(status["workers"], key=lambda w: w["age"])]


async def _signals_ready() -> None:
    """The pool's signal handler process has installed its handlers (so a signal sent to this
    process now reaches it instead of its default action)."""
    await _until(lambda: signal.getsignal(signal.SIGTTOU) not in (signal.SIG_DFL, None))


async def test_dirty_timeout_zero_never_kills_a_silent_worker(
    start_pool: Any, socket_path: str
) -> None:
    # With a 0 read as "0 seconds", the first tick would kill a worker whose loop is blocked.
    await start_pool(dirty_apps=[LOG], dirty_workers=1, dirty_timeout=0)
    client = dirty.DirtyClient(socket_path)
    [before] = [w["pid"] for w in (await _status(client))["workers"]]
    assert await client.execute_async(LOG, "async_block", 0.6) == 0.6
    assert [w["pid"] for w in (await _status(client))["workers"]] == [before]
    await client.close_async()


async def test_a_crashed_worker_comes_back_with_the_same_apps(
    start_pool: Any, socket_path: str
) -> None:
    await start_pool(dirty_apps=[ECHO, f"{LIMITED}:1"], dirty_workers=2)
    client = dirty.DirtyClient(socket_path)
    status = await _settled(client, 2)
    assert _layout(status) == [sorted([ECHO, LIMITED]), [ECHO]]  # worker 1 gets it
    [holder] = [w for w in status["workers"] if LIMITED in w["apps"]]
    os.kill(holder["pid"], signal.SIGKILL)
    status = await _settled(client, 2, {holder["pid"]})
    assert status["app_workers"] == {ECHO: 2, LIMITED: 1}
    [back] = [w for w in status["workers"] if LIMITED in w["apps"]]
    assert back["age"] == holder["age"]  # the same worker, restarted
    assert await client.execute_async(LIMITED, "pid") == back["pid"]
    await client.close_async()


async def test_sigterm_to_a_worker_lets_its_calls_finish_and_the_pool_replaces_it(
    start_pool: Any, socket_path: str, tmp_path: Path
) -> None:
    """Gunicorn's worker on SIGTERM: the calls running finish (their callers get results, not
    DirtyWorkerError), no new call goes to it, it exits and the pool starts a replacement."""
    await start_pool(dirty_apps=[MARK], dirty_workers=2, dirty_graceful_timeout=20.0)
    client = dirty.DirtyClient(socket_path, timeout=30)
    status = await _settled(client, 2)
    async with trio.open_nursery() as nursery:
        results = await _holding(nursery, client, [tmp_path / "a", tmp_path / "b"], 1.0)
        victim = status["workers"][0]
        os.kill(victim["pid"], signal.SIGTERM)
        with trio.fail_after(10):  # (the worker tells the node, which tells the router)
            while not [w for w in (await _status(client))["workers"] if w["draining"]]:
                await trio.sleep(0.02)
        # No new call goes to the draining worker while its call runs.
        others = {w["pid"] for w in status["workers"]} - {victim["pid"]}
        for _ in range(4):
            assert await client.execute_async(MARK, "pid") in others
    assert results == [1.0, 1.0]
    status = await _settled(client, 2, {victim["pid"]})
    [back] = [w for w in status["workers"] if w["age"] == victim["age"]]
    assert back["pid"] != victim["pid"]
    await client.close_async()


async def test_dirty_max_requests_replaces_a_worker_gracefully_and_loses_no_call(
    start_pool: Any, socket_path: str
) -> None:
    """Gunicorn's max_requests: after 3 calls the worker is replaced (its replacement first,
    so a one-worker pool always has a worker), and every call is answered."""
    await start_pool(dirty_apps=[MARK], dirty_workers=1, dirty_max_requests=3)
    client = dirty.DirtyClient(socket_path, timeout=30)
    seen: list[int] = []
    with trio.fail_after(60):
        while len(set(seen)) < 3:
            seen.append(await client.execute_async(MARK, "pid"))  # raises if a call is lost
    status = await _settled(client, 1)
    assert status["workers"][0]["pid"] in seen
    await client.close_async()


async def test_hup_replaces_every_worker_with_the_same_apps_and_drains_the_old_ones(
    start_pool: Any, socket_path: str, tmp_path: Path
) -> None:
    await start_pool(dirty_apps=[MARK, f"{LIMITED}:1"], dirty_workers=2, handle_signals=True)
    client = dirty.DirtyClient(socket_path, timeout=30)
    before = await _settled(client, 2)
    assert _layout(before) == [sorted([LIMITED, MARK]), [MARK]]
    old = {w["pid"] for w in before["workers"]}
    await _signals_ready()
    mark = tmp_path / "running"
    results: list[Any] = []

    async def slow() -> None:
        results.append(await client.execute_async(MARK, "hold", str(mark), 0.8))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow)
        await _until(mark.exists)  # the call runs in an old worker
        os.kill(os.getpid(), signal.SIGHUP)
    assert results == [0.8]  # finished there: drained, not failed
    after = await _settled(client, 2, old)
    assert _layout(after) == _layout(before)
    assert after["app_workers"] == {MARK: 2, LIMITED: 1}
    assert after["target_workers"] == 2
    assert await client.execute_async(LIMITED, "pid") not in old
    await client.close_async()


async def test_ttin_and_ttou_signals_scale_and_never_go_below_the_largest_n(
    start_pool: Any, socket_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    await start_pool(dirty_apps=[ECHO, f"{LIMITED}:2"], dirty_workers=2, handle_signals=True)
    client = dirty.DirtyClient(socket_path)
    await _settled(client, 2)
    await _signals_ready()
    with caplog.at_level(logging.WARNING, logger="apps.dirty"):
        os.kill(os.getpid(), signal.SIGTTOU)  # at the minimum already: a warning, no change
        await _until(lambda: any("never shrinks below 2" in r.getMessage() for r in caplog.records))
    status = await _settled(client, 2)
    os.kill(os.getpid(), signal.SIGTTIN)
    status = await _settled(client, 3)
    assert _layout(status) == [sorted([ECHO, LIMITED]), sorted([ECHO, LIMITED]), [ECHO]]
    assert status["target_workers"] == 3
    newest = max(status["workers"], key=lambda w: w["age"])
    caplog.clear()
    os.kill(os.getpid(), signal.SIGTTOU)
    status = await _settled(client, 2, {newest["pid"]})  # the one that held no limited app went
    assert status["app_workers"] == {ECHO: 2, LIMITED: 2}
    assert status["target_workers"] == 2
    with caplog.at_level(logging.WARNING, logger="apps.dirty"):
        os.kill(os.getpid(), signal.SIGTTOU)
        await _until(lambda: any("never shrinks below 2" in r.getMessage() for r in caplog.records))
    assert (await _settled(client, 2))["app_workers"] == {ECHO: 2, LIMITED: 2}
    await client.close_async()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "ctrl-c-to-the-group"])
async def test_the_node_drains_the_calls_in_flight_on_every_worker(
    tmp_path: Path, how: str
) -> None:
    """TERM, INT, and a terminal's Ctrl-C (SIGINT to the whole process group, workers too):
    each worker finishes its call before the node exits 0."""
    async with Node(
        tmp_path, "--dirty-app", MARK, "--dirty-workers", "2", session=how.startswith("ctrl")
    ) as node:
        client = dirty.DirtyClient(node.socket, timeout=30)
        pids = {w["pid"] for w in (await _status(client))["workers"]}
        assert len(pids) == 2
        async with trio.open_nursery() as nursery:
            results = await _holding(nursery, client, [tmp_path / "a", tmp_path / "b"], 0.5)
            if how == "ctrl-c-to-the-group":
                os.killpg(node.process.pid, signal.SIGINT)
            else:
                node.process.send_signal(getattr(signal, how))
        assert results == [0.5, 0.5]
        with trio.fail_after(10):
            assert await node.process.wait() == 0
        await _until(lambda: all(_exited(pid) for pid in pids))
        assert "stopping gracefully" in node.text()
        await client.close_async()


async def test_term_kills_a_call_still_running_at_the_graceful_timeout(tmp_path: Path) -> None:
    async with Node(
        tmp_path, "--dirty-app", MARK, "--dirty-workers", "1", "--dirty-graceful-timeout", "0.5"
    ) as node:
        client = dirty.DirtyClient(node.socket, timeout=60)
        [pid] = [w["pid"] for w in (await _status(client))["workers"]]
        mark = tmp_path / "running"
        outcome: list[Any] = []

        async def stuck() -> None:
            try:
                outcome.append(await client.execute_async(MARK, "hold", str(mark), 30))
            except dirty.DirtyError as exc:
                outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stuck)
            await _until(mark.exists)
            node.process.send_signal(signal.SIGTERM)
        assert isinstance(outcome[0], dirty.DirtyWorkerError)
        assert "dirty_graceful_timeout" in str(outcome[0])
        # Killed at the graceful timeout: the node is gone well before 0.5 s + KILL_TIMEOUT.
        with trio.fail_after(2.5):
            assert await node.process.wait() == 0
        assert _exited(pid)
        await client.close_async()


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    return tmp_path / "gate"


async def _hold(gate: Path) -> int:
    """Open the gate FIFO for writing: returns once a worker loading GatedApp waits on it (the
    caller closes the fd to let it go on)."""
    with trio.fail_after(20):
        return await trio.to_thread.run_sync(os.open, gate, os.O_WRONLY, abandon_on_cancel=True)


async def test_a_worker_still_loading_its_apps_exits_when_the_node_dies(
    tmp_path: Path, gate: Path
) -> None:
    os.mkfifo(gate)
    fd = -1
    async with Node(
        tmp_path,
        "--dirty-app",
        GATED,
        "--dirty-workers",
        "1",
        wait=False,
        DIRTY_TEST_GATE=str(gate),
    ) as node:
        try:
            fd = await _hold(gate)  # the first worker is in GatedApp.init()
            [worker] = _children(node.process.pid)
            node.process.kill()
            await node.process.wait()
            with trio.fail_after(3.5):  # _PARENT_POLL + _ORPHAN_GRACE, and some
                while not _exited(worker):
                    await trio.sleep(0.05)
        finally:
            if fd >= 0:
                os.close(fd)  # (lets a surviving worker finish init, see the node gone, exit)


@pytest.mark.parametrize("start", ["ttin", "replacement"])
async def test_term_while_a_worker_start_is_under_way_stops_the_node(
    tmp_path: Path, gate: Path, start: str
) -> None:
    """A TTIN's new worker, or a killed worker's replacement, is still loading its apps (a
    model taking minutes) when TERM comes: the node stops anyway, within the graceful timeout
    (nothing is in flight), the loading worker goes too, and the cut-short start is part of the
    shutdown, not a supervisor start_error."""
    async with Node(
        tmp_path,
        "--dirty-app", GATED, "--dirty-workers", "1", "--dirty-graceful-timeout", "0.5",
        DIRTY_TEST_GATE=str(gate),
    ) as node:  # fmt: skip
        client = dirty.DirtyClient(node.socket)
        [first] = [w["pid"] for w in (await _status(client))["workers"]]
        os.mkfifo(gate)
        if start == "ttin":
            node.process.send_signal(signal.SIGTTIN)
        else:
            os.kill(first, signal.SIGKILL)
        fd = await _hold(gate)
        try:
            [loading] = [p for p in _children(node.process.pid) if p != first]
            node.process.send_signal(signal.SIGTERM)
            with trio.fail_after(5):
                assert await node.process.wait() == 0
            await _until(lambda: _exited(first) and _exited(loading), timeout=3)
        finally:
            os.close(fd)
        assert "start_error" not in node.text()
        if start == "ttin":  # (a killed worker is rightly an ERROR report of its own)
            assert "ERROR" not in node.text()
        await client.close_async()


async def test_a_restarted_node_kills_a_real_orphan_of_its_crashed_life(tmp_path: Path) -> None:
    """A worker that could not see its node die (stopped) is left behind when the node is
    SIGKILLed; the next node on the same PID file kills it, and lists only its own workers."""
    async with Node(tmp_path, "--dirty-app", ECHO, "--dirty-workers", "1") as first:
        client = dirty.DirtyClient(first.socket)
        [orphan] = [w["pid"] for w in (await _status(client))["workers"]]
        await client.close_async()
        await _until(
            lambda: first.pidfile.read_text().split() == [str(first.process.pid), str(orphan)]
        )
        os.kill(orphan, signal.SIGSTOP)
        try:
            first.process.kill()
            await first.process.wait()
            assert not _exited(orphan)
            async with Node(tmp_path, "--dirty-app", ECHO, "--dirty-workers", "1") as second:
                await _until(lambda: _exited(orphan), timeout=5)
                assert "killed orphan worker" in second.text()
                client = dirty.DirtyClient(second.socket)
                [mine] = [w["pid"] for w in (await _status(client))["workers"]]
                assert await client.execute_async(ECHO, "echo", 1) == 1
                await _until(
                    lambda: (
                        second.pidfile.read_text().split() == [str(second.process.pid), str(mine)]
                    )
                )
                await client.close_async()
                second.process.send_signal(signal.SIGTERM)
                with trio.fail_after(10):
                    assert await second.process.wait() == 0
                assert not second.pidfile.exists()  # a clean stop removes it
        finally:
            if not _exited(orphan):
                os.kill(orphan, signal.SIGKILL)


async def test_hooks_found_in_a_dirty_config_module_named_by_the_flag(tmp_path: Path) -> None:
    """``--dirty-config MODULE``: dirty_worker_init runs in each worker (after its apps load),
    for the replacements a HUP starts too."""
    async with Node(
        tmp_path, "--dirty-app", LOG, "--dirty-workers", "2", "--dirty-config", HOOKS
    ) as node:
        client = dirty.DirtyClient(node.socket)

        async def marks() -> set[str]:
            seen = set()
            for _ in range(6):
                seen.add(await client.execute_async(LOG, "env", "DIRTY_TEST_INIT"))
            return seen

        status = await _status(client)
        expected = {f"{w['age']}:{w['pid']}:{LOG}" for w in status["workers"]}
        assert await marks() == expected
        old = {w["pid"] for w in status["workers"]}
        node.process.send_signal(signal.SIGHUP)
        status = await _settled(client, 2, old)
        assert await marks() == {f"{w['age']}:{w['pid']}:{LOG}" for w in status["workers"]}
        await client.close_async()
