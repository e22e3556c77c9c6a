"""Lifecycle edges of the dirty pool: signals to the node (TERM/INT drain, HUP, TTIN/TTOU),
per-app allocation across replacements, settings from the command line and node.toml, hooks,
parent-death detection and the PID file.

Real node processes (``python -m otp.node --app apps.dirty``) where the OS is part of the
behaviour, the ``start_pool`` fixture (a pool in the test's node) elsewhere. Conditions are
waited for with a generous bound, never with a bare sleep standing in for an event.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from apps import dirty

from .conftest import ECHO, LIMITED

LOG = "tests.test_apps.test_dirty.dirty_apps:LogApp"
GATED = "tests.test_apps.test_dirty.dirty_apps:GatedApp"
HOOKS = "tests.test_apps.test_dirty.dirty_hooks"
ROOT = Path(__file__).resolve().parents[3]
MARK = "tests.test_apps.test_dirty.test_edges_lifecycle:MarkApp"


class MarkApp(dirty.DirtyApp):
    """A call that tells the test it has started running (it creates the file ``mark``)."""

    def hold(self, mark: str, seconds: float) -> float:
        Path(mark).touch()
        time.sleep(seconds)
        return seconds

    def pid(self) -> int:
        return os.getpid()


# ------------------------------------------------------------------------------- helpers


def _env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), **extra)


def _state(pid: int) -> str:
    """The process's state letter; "Z" once it is gone (or a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def _gone(pid: int) -> bool:
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
    which may come just after the worker announced itself)."""
    with trio.fail_after(20):
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


# ---------------------------------------------------------------- settings and config errors


def _node_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "otp.node", "--app", "apps.dirty", *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dirty-workers", "-1"], "dirty_workers must be an int >= 0 (got -1)"),
        (["--dirty-app", "nocolon"], "Invalid import path format: nocolon"),
        (["--dirty-app", f"{ECHO}:0"], "Worker count must be >= 1"),
        (["--config", "{tmp}/node.toml"], "dirty_threads must be an int >= 1 (got 0)"),
    ],
    ids=["negative-workers", "bad-spec", "zero-count", "toml-threads"],
)
def test_a_bad_dirty_setting_at_the_command_line_is_a_one_line_error(
    tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "node.toml").write_text(f'[dirty]\ndirty_apps = ["{ECHO}"]\ndirty_threads = 0\n')
    result = _node_cli(*(a.format(tmp=tmp_path) for a in args))
    assert message in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("python -m otp.node: ")
    assert result.returncode == 2


@pytest.mark.parametrize(
    "setting",
    [
        {"dirty_timeout": math.nan},
        {"dirty_graceful_timeout": math.nan},
        {"dirty_socket": 5},
        {"dirty_pidfile": 5},
        {"handle_signals": "no"},
    ],
    ids=["nan-timeout", "nan-graceful", "int-socket", "int-pidfile", "str-handle-signals"],
)
def test_a_nonsense_setting_value_is_a_dirty_config_error(setting: dict[str, Any]) -> None:
    with pytest.raises(dirty.DirtyConfigError, match=next(iter(setting))):
        dirty.DirtyConfig.from_settings({"dirty": {"dirty_apps": [ECHO], **setting}})


@pytest.mark.parametrize(
    "hook", ["on_dirty_starting", "dirty_post_fork", "dirty_worker_init", "dirty_worker_exit"]
)
def test_a_hook_path_that_cannot_load_is_refused_with_the_config(hook: str) -> None:
    with pytest.raises(dirty.DirtyConfigError, match=hook):
        dirty.DirtyConfig.from_settings(
            {"dirty": {"dirty_apps": [ECHO], hook: "no_such_module_for_dirty:hook"}}
        )


def test_cli_flags_win_over_node_toml_and_zero_is_kept() -> None:
    """``--dirty-timeout 0`` (off) and ``--dirty-workers 0`` are real values, not "unset"; the
    toml fills in what the flags leave out. 0 workers with apps is refused, naming both."""
    settings: dict[str, Any] = {
        "dirty": {
            "dirty_apps": [f"{LIMITED}:3"],
            "dirty_workers": 5,
            "dirty_timeout": 10,
            "dirty_graceful_timeout": 7,
        },
        "flags": {
            "dirty_timeout": 0.0,
            "dirty_workers": 4,
            "dirty_apps": None,
            "dirty_graceful_timeout": None,
        },
    }
    config = dirty.DirtyConfig.from_settings(settings)
    assert config.dirty_timeout == 0.0 and config.dirty_workers == 4
    assert config.worker_count == 4
    assert config.dirty_graceful_timeout == 7.0
    assert isinstance(config.dirty_graceful_timeout, float)
    settings["flags"]["dirty_workers"] = 0
    with pytest.raises(dirty.DirtyConfigError, match=r"dirty_workers = 0 .* dirty_apps names 1"):
        dirty.DirtyConfig.from_settings(settings)


def test_the_cli_spec_count_wins_over_the_class_attribute_through_the_node_flags() -> None:
    from otp.node._config import load_config

    args = ["--app", "apps.dirty", "--dirty-app", f"{LIMITED}:2", "--dirty-app", ECHO]
    node = load_config([*args, "--dirty-workers", "2"])
    config = dirty.DirtyConfig.from_settings(node.settings)
    assert config.dirty_apps == (dirty.AppSpec(LIMITED, 2), dirty.AppSpec(ECHO, None))
    assert dirty.initial_allocation(config.dirty_apps, 3) == [
        [LIMITED, ECHO],
        [LIMITED, ECHO],
        [ECHO],
    ]
    assert config.worker_count == 2


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


# --------------------------------------------------------------------- allocation, HUP, TTIN


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


# ----------------------------------------------------------- the node process: TERM, INT, kill


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
        await _until(lambda: all(_gone(pid) for pid in pids))
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
        assert _gone(pid)
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
                while not _gone(worker):
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
            await _until(lambda: _gone(first) and _gone(loading), timeout=3)
        finally:
            os.close(fd)
        assert "start_error" not in node.text()
        if start == "ttin":  # (a killed worker is rightly an ERROR report of its own)
            assert "ERROR" not in node.text()
        await client.close_async()


# ------------------------------------------------------------------------------- PID file


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
            assert not _gone(orphan)
            async with Node(tmp_path, "--dirty-app", ECHO, "--dirty-workers", "1") as second:
                await _until(lambda: _gone(orphan), timeout=5)
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
            if not _gone(orphan):
                os.kill(orphan, signal.SIGKILL)


# ----------------------------------------------------------------------------------- hooks


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
