"""The node's log output: ``--log-format text`` (the default: one readable line a record) or
``json`` (one JSON object a line, for log shippers), set up by :func:`configure_logging`.

A JSON record carries the node, and when it was logged inside a process, that process's pid,
registered name and application (``supervisors.application_of``), read when the record is
formatted: the node's handler writes synchronously in the logging task, so that is the
process that logged. Fields a caller passed with ``extra=`` are kept, as plain JSON where they
have a JSON form and as their ``repr`` where not.

The handler carries OTP's burst limit (:class:`otp.BurstLimit`: at most 500 records a second,
then it drops them and logs how many once the second is over, so a restart storm cannot make
logging the node's bottleneck); :func:`report_dropped_records` writes that count when a
dropping window ends even if nothing else is logged after it. The node's operator sets it as
OTP's handler config does: ``--log-burst-limit-enable true|false``,
``--log-burst-limit-max-count N`` and ``--log-burst-limit-window-time MS`` (or the same keys,
``log_burst_limit_...``, in node.toml's ``[node]``).

Progress reports (``supervisors.progress``: a child started) are written only at ``--log-level
debug``: OTP's logger makes them at ``info`` under a default primary level of ``notice``, so an
OTP node does not print them unless asked; Python has no ``notice``, and the node's default,
``info``, plays it.
"""

from __future__ import annotations

import datetime
import json
import logging
from typing import Any, TextIO

import trio

import otp
import supervisors

from ._config import NodeConfig

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "configure_logging",
    "configure_node_logging",
    "report_dropped_records",
]

LOG_FORMATS = ("text", "json")
#: The logger of OTP's progress reports (supervisors/_reports.py).
PROGRESS_LOGGER = "supervisors.progress"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: What every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)


class JsonFormatter(otp.ReportFormatter):
    """One JSON object a record: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, ``node``; ``pid``, ``process`` (its registered name) and ``application`` when
    logged inside a process; ``exception`` (the traceback) when there is one; and the record's
    ``extra`` fields."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "node": self.node,
        }
        entry.update(_process_fields())
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
            entry["exception"] = record.exc_text
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        return json.dumps(entry, default=repr, ensure_ascii=False)


def _process_fields() -> dict[str, Any]:
    try:
        pid = otp.self()
    except (RuntimeError, otp.OtpError):
        return {}
    fields: dict[str, Any] = {"pid": str(pid)}
    info = otp.process_info(pid)
    if info is not None and info.registered_name is not None:
        fields["process"] = str(info.registered_name)
    application = supervisors.application_of(pid)
    if application is not None:
        fields["application"] = application
    return fields


def configure_logging(
    level: str,
    log_format: str,
    node: str,
    stream: TextIO | None = None,
    *,
    burst_limit_enable: bool = True,
    burst_limit_max_count: int = 500,
    burst_limit_window_time: int = 1000,
) -> logging.Handler:
    """Set the root logger up as the node runs it: ``level``, and ``log_format`` ``"text"`` or
    ``"json"`` on ``stream`` (stderr by default), behind OTP's burst limit (at most
    ``burst_limit_max_count`` records per ``burst_limit_window_time`` milliseconds) unless
    ``burst_limit_enable`` is False; progress reports only when ``level`` is ``"debug"``.
    Returns the handler.

    Raises:
        ValueError: ``burst_limit_max_count`` or ``burst_limit_window_time`` is not >= 1
            (:class:`otp.BurstLimit` says which), when the limit is on.
    """
    handler = _RecordStreamHandler(stream)
    if log_format == "json":
        handler.setFormatter(JsonFormatter(node))
    else:
        handler.setFormatter(otp.ReportFormatter(TEXT_FORMAT))
    if burst_limit_enable:
        window = burst_limit_window_time / 1000
        handler.addFilter(otp.BurstLimit(handler, burst_limit_max_count, window))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    # Set on the logger, not filtered in the handler: a supervisor then skips making the record.
    progress = logging.getLogger(PROGRESS_LOGGER)
    progress.setLevel(logging.NOTSET if level.upper() == "DEBUG" else logging.WARNING)
    return handler


def configure_node_logging(config: NodeConfig, stream: TextIO | None = None) -> logging.Handler:
    """:func:`configure_logging` as ``config`` (the node's flags and node.toml) asks."""
    return configure_logging(
        config.log_level,
        config.log_format,
        config.name,
        stream,
        burst_limit_enable=config.log_burst_limit_enable,
        burst_limit_max_count=config.log_burst_limit_max_count,
        burst_limit_window_time=config.log_burst_limit_window_time,
    )


class _RecordStreamHandler(logging.StreamHandler):
    """``logging.StreamHandler`` that writes a record with one ``write``, and flushes only a
    stream that does not flush its own lines (stderr is line-buffered: a second flush per
    record is a system call's worth of nothing)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = self.stream
            stream.write(self.format(record) + self.terminator)
            if not getattr(stream, "line_buffering", False):
                self.flush()
        except RecursionError:  # as StreamHandler.emit: never swallowed
            raise
        except Exception:
            self.handleError(record)


def burst_limits() -> list[otp.BurstLimit]:
    """The burst limits on the root logger's handlers (``configure_logging`` puts one on its
    handler), in the handlers' order."""
    return [
        f
        for handler in logging.getLogger().handlers
        for f in handler.filters
        if isinstance(f, otp.BurstLimit)
    ]


async def report_dropped_records() -> None:
    """Write the dropped count of every burst limit on the root logger's handlers as soon as
    its window ends (a storm that ends in silence is reported too). Runs until cancelled;
    sleeps while nothing is dropped."""
    limits = burst_limits()
    if not limits:
        return
    token = trio.lowlevel.current_trio_token()
    dropping = trio.Event()

    def wake() -> None:
        # Called by whichever thread logged the first dropped record.
        token.run_sync_soon(dropping.set)

    for limit in limits:
        limit.on_dropping = wake
    try:
        while True:
            await dropping.wait()
            dropping = trio.Event()
            for limit in limits:
                if limit.dropped:
                    await trio.sleep(max(0.0, limit.window_end - limit.clock()))
                    limit.flush_dropped()
    finally:
        for limit in limits:
            limit.on_dropping = None
