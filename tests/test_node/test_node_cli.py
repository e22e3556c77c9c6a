"""``python -m otp.node`` as a user runs it: a real OS process, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from test_otp.peer import COOKIE

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Node:
    """A ``python -m otp.node`` process whose stdout is read line by line."""

    def __init__(self, *args: str) -> None:
        self.args = [sys.executable, "-m", "otp.node", "--log-level", "warning", *args]
        self.lines: list[str] = []
        self.process: trio.Process | None = None
        self._buffer = b""

    async def __aenter__(self) -> Node:
        self.process = await trio.lowlevel.open_process(
            self.args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.process is not None
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()
        if self.process.stdout is not None:
            await self.process.stdout.aclose()

    async def line_with(self, text: str, timeout: float = 20) -> str:
        assert self.process is not None and self.process.stdout is not None
        with trio.fail_after(timeout):
            while True:
                for i, line in enumerate(self.lines):
                    if text in line:
                        del self.lines[: i + 1]
                        return line
                chunk = await self.process.stdout.receive_some(65536)
                if not chunk:
                    raise AssertionError(f"node exited before printing {text!r}: {self.lines}")
                self._buffer += chunk
                *complete, self._buffer = self._buffer.split(b"\n")
                self.lines.extend(line.decode() for line in complete)

    async def rest(self) -> list[str]:
        """Everything it prints until it exits."""
        assert self.process is not None and self.process.stdout is not None
        with trio.fail_after(20):
            while chunk := await self.process.stdout.receive_some(65536):
                self._buffer += chunk
        self.lines.extend(line.decode() for line in self._buffer.split(b"\n") if line)
        return self.lines

    async def exit_code(self) -> int:
        assert self.process is not None
        with trio.fail_after(20):
            return await self.process.wait()

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)


def test_help_lists_the_options() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "otp.node", "--help"], capture_output=True, text=True, check=True
    )
    for option in ("--name", "--app", "--log-level", "--listen", "--cookie-file", "--connect"):
        assert option in result.stdout


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_the_default_node_runs_the_demo_tree_and_stops_gracefully(signum: int) -> None:
    async with Node("--name", "demo@localhost") as node:
        assert "demo@localhost" in await node.line_with("is running")
        await node.line_with("observer on http://127.0.0.1:")  # on by default here
        await node.line_with("application demo")
        await node.line_with("greeter")
        dirty = await node.line_with("application dirty")
        assert "apps.dirty.examples:ExampleApp" in dirty
        assert "export GUNICORN_DIRTY_SOCKET=/" in dirty
        matching = await node.line_with("application matching")
        assert "workers and clients connect to unix:/" in matching
        assert "otp-matching-" in matching and "matching.sqlite3" in matching
        await node.line_with("stop with Ctrl-C")
        node.signal(signum)
        await node.line_with("stopping gracefully")
        await node.line_with("stopped")
        assert await node.exit_code() == 0


async def test_applications_start_in_order_and_stop_in_reverse() -> None:
    async with Node(
        "--app", "test_node.node_apps:first", "--app", "test_node.node_apps:second"
    ) as node:
        await node.line_with("stop with Ctrl-C")
        node.signal(signal.SIGTERM)
        assert await node.exit_code() == 0
        lines = [line for line in await node.rest() if line.startswith(("init", "terminate"))]
    assert [line for line in node.lines if line.startswith("init")] == []
    assert lines == [
        "terminate second.c shutdown",
        "terminate first.b shutdown",
        "terminate first.a shutdown",
    ]


async def test_a_second_sigint_stops_the_node_at_once() -> None:
    async with Node("--app", "test_node.node_apps:slow") as node:
        await node.line_with("stop with Ctrl-C")
        node.signal(signal.SIGINT)
        await node.line_with("terminate slow.sleepy shutdown")
        node.signal(signal.SIGINT)
        await node.line_with("second SIGINT")
        assert await node.exit_code() == 130


async def test_a_permanent_applications_death_stops_the_node() -> None:
    async with Node("--app", "test_node.node_apps:fragile") as node:
        await node.line_with("application fragile ended")
        assert await node.exit_code() == 1


async def test_an_application_factory_gets_the_node_config() -> None:
    async with Node("--name", "f@localhost", "--app", "test_node.node_apps:echo_stdout") as node:
        await node.line_with("factory saw node f@localhost")
        await node.line_with("stop with Ctrl-C")
        node.signal(signal.SIGTERM)
        assert await node.exit_code() == 0


async def test_the_cli_node_tunes_its_garbage_collector() -> None:
    from otp.node._main import GC_THRESHOLDS

    async with Node("--app", "test_node.node_apps:gc_report") as node:
        line = await node.line_with("gc thresholds")
        assert line.startswith(f"gc thresholds {GC_THRESHOLDS} frozen ")
        assert int(line.rsplit(" ", 1)[1]) > 1000  # (what booting allocated: modules, classes)
        node.signal(signal.SIGTERM)
        assert await node.exit_code() == 0


def test_a_bad_application_path_is_a_clear_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "otp.node", "--app", "no_such_module:app"],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert result.returncode == 2
    assert "cannot import module 'no_such_module'" in result.stderr


def test_a_cookie_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    cookie = tmp_path / "cookie"
    cookie.write_text("a-long-enough-cookie")
    cookie.chmod(0o644)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "otp.node",
            "--name",
            "a@localhost",
            "--listen",
            f"unix:{tmp_path / 'a.sock'}",
            "--cookie-file",
            str(cookie),
        ],
        capture_output=True,
        text=True,
        env=_env(),
    )
    assert result.returncode == 2
    assert "must be readable by its owner only" in result.stderr
    assert f"chmod 600 {cookie}" in result.stderr


#: A node with a small app, quiet unless something goes wrong.
_NODE = (
    sys.executable, "-m", "otp.node", "--log-level", "warning",
    "--app", "test_node.node_apps:second",
)  # fmt: skip


def _node_cli(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``python -m otp.node`` with a small app; a node that should refuse its flags but
    boots instead is killed after ``timeout`` (and the test fails). The bound is generous: a
    refusing node exits as soon as it has read its flags, but its start (Python, trio, the app
    imported) takes seconds on a loaded machine (4 s failed there)."""
    argv = [*_NODE, *args]
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=timeout
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(
            f"the node booted instead of refusing {args}: {exc.stdout!r}"
        ) from None


@pytest.fixture
def cookie_file(tmp_path: Path) -> Path:
    path = tmp_path / "cookie"
    path.write_bytes(COOKIE)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    ("case", "args", "error"),
    [
        ("missing cookie file", ["--cookie-file", "{tmp}/nope"], "cannot read it"),
        ("empty cookie file", ["--cookie-file", "{tmp}/empty"], "is empty"),
        ("short cookie", ["--cookie-file", "{tmp}/short"], "at least 8 bytes"),
        ("connect without an address", ["--connect", "b@localhost"], "--connect takes"),
        ("connect without a host", ["--connect", "b@unix:/tmp/b.sock"], "--connect takes"),
        ("partial TLS flags", ["--tls-cert", "x.pem"], "needs all of"),
        ("no cookie file", ["--cookie-file", None], "needs --cookie-file"),
        pytest.param(
            "bad --listen syntax",
            ["--listen", "nonsense"],
            "an address is",
        ),
        pytest.param(
            "plain tcp without --insecure-tcp",
            ["--listen", "tcp:127.0.0.1:0"],
            "needs TLS certificates",
        ),
        pytest.param(
            "bad --connect address",
            ["--connect", "b@localhost@tcp:127.0.0.1:notaport"],
            "an address is",
        ),
        pytest.param(
            "a cookie file that is a directory",
            ["--cookie-file", "{tmp}/cookiedir"],
            "cookie file",
        ),
        pytest.param(
            "a negative liveness timeout",
            ["--liveness-timeout", "-1"],
            "liveness",
        ),
        pytest.param(
            "a TLS key file readable by others",
            ["--tls-cert", "{tmp}/c.pem", "--tls-key", "{tmp}/open.key", "--tls-ca", "{tmp}/c.pem"],
            "open.key has mode 0644",
        ),
        pytest.param(
            "a queue limit below the busy limit",
            ["--dist-busy-limit", "4096", "--dist-queue-limit", "1024"],
            "queue_limit",
        ),
    ],
)
def test_bad_distribution_flags_are_a_clear_error_with_exit_code_2(
    tmp_path: Path, cookie_file: Path, case: str, args: list[Any], error: str
) -> None:
    (tmp_path / "empty").write_bytes(b"\n")
    (tmp_path / "empty").chmod(0o600)
    (tmp_path / "short").write_bytes(b"abc")
    (tmp_path / "short").chmod(0o600)
    (tmp_path / "open.key").write_bytes(b"a key")
    (tmp_path / "open.key").chmod(0o644)
    (tmp_path / "cookiedir").mkdir(mode=0o700)
    (tmp_path / "cookiedir").chmod(0o700)
    flags = {
        "--name": "a@localhost",
        "--listen": f"unix:{tmp_path}/a.sock",
        "--cookie-file": str(cookie_file),
    }
    extra: list[str] = []
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag in flags:
            if value is None:
                del flags[flag]
            else:
                flags[flag] = value.format(tmp=tmp_path)
        else:
            extra += [flag, value.format(tmp=tmp_path)]
    argv = [item for pair in flags.items() for item in pair] + extra
    result = _node_cli(*argv)
    assert result.returncode == 2, (case, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("python -m otp.node: ")
    assert error in result.stderr


def test_listening_without_a_node_name_is_a_clear_error(tmp_path: Path, cookie_file: Path) -> None:
    result = _node_cli("--listen", f"unix:{tmp_path}/a.sock", "--cookie-file", str(cookie_file))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "name like 'a@host'" in result.stderr


async def test_the_cli_node_on_insecure_tcp_warns_and_prints_its_real_port(
    cookie_file: Path,
) -> None:
    argv = [
        *_NODE,
        "--name",
        "a@localhost",
        "--listen",
        "tcp:127.0.0.1:0",
        "--insecure-tcp",
        "--cookie-file",
        str(cookie_file),
    ]
    process = await trio.lowlevel.open_process(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT
    )
    assert process.stdout is not None
    output = b""
    try:
        with trio.fail_after(20):
            while b"stop with Ctrl-C" not in output:
                chunk = await process.stdout.receive_some(65536)
                assert chunk, output
                output += chunk
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(20):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stdout.aclose()
    text = output.decode()
    assert "WARNING" in text and "plain TCP" in text
    [listening] = [line for line in text.splitlines() if "listening on" in line]
    port = int(listening.rsplit(":", 1)[1])
    assert port > 0
