"""The node's log output: ``--log-format json`` writes one JSON object a line with the node,
and the pid, registered name and application of the process that logged; OTP's burst limit on
its handler, set by ``--log-burst-limit-*`` (or node.toml's ``log_burst_limit_*``)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trio.testing

import otp
import supervisors
from otp.node import NodeConfig, configure_logging, configure_node_logging, load_config
from otp.node._config import ConfigError
from otp.node._logs import PROGRESS_LOGGER, JsonFormatter, report_dropped_records

from .test_node_cli import ROOT, _env, _node_cli

log = logging.getLogger("tests.node.logs")


def _capture() -> tuple[logging.Handler, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter("n1@host"))
    return handler, out


class Talker(otp.GenServer):
    async def init(self, _: Any) -> otp.Ok:
        return otp.Ok(None)

    async def handle_call(self, request: Any, from_: Any, state: Any) -> Any:
        log.warning("asked %s", request, extra={"order": {"id": 7, "items": [1, 2]}})
        return otp.Reply("ok", state)


async def _start_talker() -> Any:
    return await Talker.start_link(None, name="talker")


async def test_a_record_logged_in_an_applications_process_names_it() -> None:
    handler, out = _capture()
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        async with otp.open_node():
            children = [supervisors.ChildSpec("talker", (_start_talker,))]
            app = supervisors.Application("shop", (supervisors.SupFlags(), children))
            await supervisors.start_application(app)
            assert await otp.call("talker", "price") == "ok"
            log.info("from main", extra={"blob": b"\x00", "odd": object()})
            await supervisors.stop_application("shop")
        log.error("outside any node")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
    finally:
        log.removeHandler(handler)
        log.setLevel(logging.NOTSET)
    talked, main, outside, failed = (json.loads(line) for line in out.getvalue().splitlines())
    assert talked["message"] == "asked price" and talked["level"] == "WARNING"
    assert (talked["node"], talked["process"], talked["application"]) == (
        "n1@host",
        "talker",
        "shop",
    )
    assert talked["pid"].startswith("<nonode@nohost.")
    assert talked["order"] == {"id": 7, "items": [1, 2]}  # extra= kept as JSON
    assert talked["time"].endswith("+00:00") and talked["logger"] == "tests.node.logs"
    assert "application" not in main and main["pid"].startswith("<")  # the node's main process
    assert main["blob"] == repr(b"\x00") and main["odd"].startswith("<object")
    assert "pid" not in outside and outside["node"] == "n1@host"
    assert failed["exception"].startswith("Traceback") and "ValueError: boom" in failed["exception"]


def test_the_log_format_is_a_flag_and_a_node_toml_key(tmp_path: Any) -> None:
    assert load_config(["--log-format", "json"]).log_format == "json"
    assert load_config([]).log_format == "text"
    toml = tmp_path / "node.toml"
    toml.write_text('[node]\nlog_format = "json"\n')
    assert load_config(["--config", str(toml)]).log_format == "json"
    with pytest.raises(ConfigError, match=r"log_format must be text or json \(got 'xml'\)"):
        NodeConfig(log_format="xml")


async def test_the_node_writes_json_lines_with_its_name() -> None:
    args = [
        sys.executable, "-m", "otp.node", "--name", "logs@localhost", "--log-format", "json",
        "--log-level", "debug",  # the progress report of 'listener' is the line waited for
        "--app", "apps.matching", "--matching-listen",
        f"unix:/tmp/otp-logs-{os.getpid()}.sock", "--matching-store", ":memory:",
    ]  # fmt: skip
    process = await trio.lowlevel.open_process(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT
    )
    assert process.stdout is not None
    lines: list[dict[str, Any]] = []
    buffer = b""
    try:
        with trio.fail_after(30):
            while not any("started child 'listener'" in e.get("message", "") for e in lines):
                chunk = await process.stdout.receive_some(65536)
                assert chunk, f"the node exited: {buffer!r}"
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                lines.extend(json.loads(line) for line in complete if line.startswith(b"{"))
    finally:
        process.terminate()
        await process.wait()
        await process.stdout.aclose()
    assert lines and all(entry["node"] == "logs@localhost" for entry in lines)
    assert any(entry.get("process") == "matching_sup" for entry in lines)


@contextmanager
def _node_root_logging(
    log_format: str = "text", level: str = "info", config: NodeConfig | None = None
) -> Iterator[tuple[logging.Handler, io.StringIO]]:
    """The root logger as the node sets it up (from ``config``, else a node's defaults with
    ``log_format`` and ``level``), writing to a StringIO (pytest's own handlers are put back
    after)."""
    if config is None:
        config = NodeConfig(name="n1@host", log_level=level, log_format=log_format)
    root = logging.getLogger()
    progress = logging.getLogger(PROGRESS_LOGGER)
    saved = root.handlers[:], root.level, progress.level
    root.handlers.clear()
    out = io.StringIO()
    try:
        yield configure_node_logging(config, out), out
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        progress.setLevel(saved[2])


def test_the_node_text_log_is_one_line_a_record_with_its_traceback() -> None:
    with _node_root_logging("text") as (_, out):
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed: %s", "why")
    text = out.getvalue()
    assert " ERROR tests.node.logs: it failed: why\nTraceback (most recent call last):\n" in text
    assert text.endswith('    raise ValueError("boom")\nValueError: boom\n')


async def test_the_node_writes_the_dropped_count_when_a_storm_ends_in_silence(
    autojump_clock: Any,
) -> None:
    with _node_root_logging("text") as (handler, out):
        (limit,) = [f for f in handler.filters if isinstance(f, otp.BurstLimit)]
        assert (limit.max_count, limit.window) == (500, 1.0)  # OTP's defaults
        limit.clock = trio.current_time
        async with trio.open_nursery() as nursery:
            nursery.start_soon(report_dropped_records)
            await trio.testing.wait_all_tasks_blocked()
            for n in range(limit.max_count + 7):
                log.error("storm %d", n)
            await trio.sleep(2 * limit.window)  # and nothing else is logged
            nursery.cancel_scope.cancel()
    lines = out.getvalue().splitlines()
    assert len(lines) == 501
    assert lines[499].endswith("ERROR tests.node.logs: storm 499")
    assert lines[500].endswith(
        "WARNING otp.logger: burst limit: dropped 7 log records (more than 500 in 1 s)"
    )


def test_the_burst_limit_is_set_by_flags_and_node_toml_keys(tmp_path: Any) -> None:
    default = load_config([])
    assert (
        default.log_burst_limit_enable,
        default.log_burst_limit_max_count,
        default.log_burst_limit_window_time,
    ) == (True, 500, 1000)  # OTP's handler defaults (the window in milliseconds)
    flags = load_config(
        [
            "--log-burst-limit-enable", "false",
            "--log-burst-limit-max-count", "20",
            "--log-burst-limit-window-time", "500",
        ]
    )  # fmt: skip
    assert (
        flags.log_burst_limit_enable,
        flags.log_burst_limit_max_count,
        flags.log_burst_limit_window_time,
    ) == (False, 20, 500)
    toml = tmp_path / "node.toml"
    toml.write_text(
        "[node]\nlog_burst_limit_enable = false\nlog_burst_limit_max_count = 7\n"
        "log_burst_limit_window_time = 250\n"
    )
    from_toml = load_config(["--config", str(toml)])
    assert (
        from_toml.log_burst_limit_enable,
        from_toml.log_burst_limit_max_count,
        from_toml.log_burst_limit_window_time,
    ) == (False, 7, 250)
    # A flag wins over its key.
    both = load_config(["--config", str(toml), "--log-burst-limit-enable", "true"])
    assert (both.log_burst_limit_enable, both.log_burst_limit_max_count) == (True, 7)


_TURN_OFF = (
    "to write every record, turn the limit off with --log-burst-limit-enable false"
    " (log_burst_limit_enable = false in node.toml's [node])"
)


@pytest.mark.parametrize(
    ("argv", "toml", "message"),
    [
        (
            ["--log-burst-limit-max-count", "0"],
            "",
            "--log-burst-limit-max-count must be an integer >= 1 (got 0): how many log records"
            f" a window writes; {_TURN_OFF}",
        ),
        (
            ["--log-burst-limit-window-time", "-5"],
            "",
            "--log-burst-limit-window-time must be an integer number of milliseconds >= 1"
            f" (got -5): the limit's window; {_TURN_OFF}",
        ),
        (
            [],
            "log_burst_limit_max_count = true",
            "node.log_burst_limit_max_count must be an integer >= 1 (got True): how many log"
            f" records a window writes; {_TURN_OFF}",
        ),
        (
            [],
            "log_burst_limit_window_time = 0.5",
            "node.log_burst_limit_window_time must be an integer number of milliseconds >= 1"
            f" (got 0.5): the limit's window; {_TURN_OFF}",
        ),
        (
            [],
            'log_burst_limit_enable = "off"',
            "node.log_burst_limit_enable must be true or false (got 'off')",
        ),
    ],
)
def test_bad_burst_limit_settings_are_rejected_saying_where_they_were_given(
    tmp_path: Any, argv: list[str], toml: str, message: str
) -> None:
    path = tmp_path / "node.toml"
    path.write_text(f"[node]\n{toml}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(["--config", str(path), *argv])
    assert str(caught.value) == message


def test_bad_burst_limit_settings_are_rejected_in_a_node_config_and_on_the_command_line(
    capsys: Any,
) -> None:
    with pytest.raises(ConfigError, match=r"^log_burst_limit_max_count must be an integer >= 1"):
        NodeConfig(log_burst_limit_max_count=0)
    with pytest.raises(ConfigError, match=r"^log_burst_limit_window_time must be an integer"):
        NodeConfig(log_burst_limit_window_time=0)
    with pytest.raises(ConfigError, match=r"^log_burst_limit_enable must be true or false"):
        NodeConfig(log_burst_limit_enable=1)  # type: ignore[arg-type]
    with pytest.raises(SystemExit):  # argparse's usage error
        load_config(["--log-burst-limit-enable", "yes"])
    assert "invalid choice: 'yes' (choose from 'true', 'false')" in capsys.readouterr().err


def test_the_node_refuses_a_bad_burst_limit_at_boot_naming_the_flag() -> None:
    result = _node_cli("--log-burst-limit-window-time", "0")
    assert result.returncode == 2
    assert result.stderr == (
        "python -m otp.node: --log-burst-limit-window-time must be an integer number of"
        f" milliseconds >= 1 (got 0): the limit's window; {_TURN_OFF}\n"
    )


async def test_a_node_with_the_burst_limit_off_logs_every_record_of_a_burst(
    autojump_clock: Any,
) -> None:
    config = load_config(["--log-burst-limit-enable", "false"])
    with _node_root_logging(config=config) as (handler, out):
        assert not [f for f in handler.filters if isinstance(f, otp.BurstLimit)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(report_dropped_records)  # (returns at once: nothing to report)
            for n in range(1200):  # more than OTP's 500 in one instant
                log.error("storm %d", n)
            await trio.sleep(2.0)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1200
    assert lines[-1].endswith("ERROR tests.node.logs: storm 1199")
    assert not any("burst limit" in line for line in lines)


async def test_a_node_with_a_small_burst_limit_drops_past_it_and_reports_the_count(
    autojump_clock: Any,
) -> None:
    config = load_config(
        ["--log-burst-limit-max-count", "3", "--log-burst-limit-window-time", "250"]
    )
    with _node_root_logging(config=config) as (handler, out):
        (limit,) = [f for f in handler.filters if isinstance(f, otp.BurstLimit)]
        assert (limit.max_count, limit.window) == (3, 0.25)
        limit.clock = trio.current_time
        async with trio.open_nursery() as nursery:
            nursery.start_soon(report_dropped_records)
            await trio.testing.wait_all_tasks_blocked()
            for n in range(10):
                log.error("storm %d", n)
            await trio.sleep(0.25)  # the window ends, and nothing else is logged
            await trio.testing.wait_all_tasks_blocked()
            log.error("after")
            nursery.cancel_scope.cancel()
    lines = out.getvalue().splitlines()
    assert [line.partition(" ERROR ")[2] for line in lines[:3]] == [
        f"tests.node.logs: storm {n}" for n in range(3)
    ]
    assert lines[3].endswith(
        "WARNING otp.logger: burst limit: dropped 7 log records (more than 3 in 0.25 s)"
    )
    assert lines[4].endswith("ERROR tests.node.logs: after") and len(lines) == 5


class _Child(otp.GenServer):
    async def init(self) -> otp.Ok:
        return otp.Ok(None)

    async def handle_cast(self, request: Any, state: Any) -> Any:
        raise RuntimeError(f"asked to {request}")


async def _restart_once() -> None:
    otp.process_flag(trap_exit=True)
    spec = supervisors.ChildSpec("child", (_Child.start_link,))
    sup = await supervisors.Supervisor.start_link(supervisors.SupFlags(), [spec])
    ((_, pid, _, _),) = await supervisors.Supervisor.which_children(sup)
    otp.cast(pid, "crash")
    while True:  # until the supervisor has started the child again
        new = (await supervisors.Supervisor.which_children(sup))[0][1]
        if isinstance(new, otp.Pid) and new != pid:
            break
    otp.exit(sup, otp.SHUTDOWN)
    await otp.receive(otp.Exit)


@pytest.mark.parametrize(("level", "progress"), [("info", False), ("debug", True)])
def test_the_node_writes_progress_reports_only_at_debug(level: str, progress: bool) -> None:
    # OTP's progress reports are at info under a default primary level of notice: a node does
    # not print them unless asked. Crash and supervisor reports are written at any level.
    with _node_root_logging("text", level) as (_, out):
        otp.run(_restart_once)
    text = out.getvalue()
    assert "RuntimeError: asked to crash" in text
    assert "ERROR supervisors: supervisor " in text and "child_terminated" in text
    assert ("started child 'child'" in text) is progress
    assert logging.getLogger(PROGRESS_LOGGER).level == logging.NOTSET  # put back


class _CountingStream(io.StringIO):
    def __init__(self, line_buffering: bool) -> None:
        super().__init__()
        self.lines_flushed = line_buffering
        self.calls: list[str] = []

    @property
    def line_buffering(self) -> bool:  # type: ignore[override]
        return self.lines_flushed

    def write(self, text: str) -> int:
        self.calls.append("write")
        return super().write(text)

    def flush(self) -> None:
        self.calls.append("flush")


@pytest.mark.parametrize(
    ("line_buffering", "calls"), [(True, ["write"]), (False, ["write", "flush"])]
)
def test_the_node_writes_a_record_in_one_write_and_flushes_only_unbuffered_streams(
    line_buffering: bool, calls: list[str]
) -> None:
    root = logging.getLogger()
    saved = root.handlers[:], root.level, logging.getLogger(PROGRESS_LOGGER).level
    root.handlers.clear()
    stream = _CountingStream(line_buffering)
    try:
        configure_logging("info", "text", "n1@host", stream)
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.getLogger(PROGRESS_LOGGER).setLevel(saved[2])
    assert stream.calls == calls
    assert stream.getvalue().endswith("ValueError: boom\n")
