"""Reports through ``logging`` as OTP's logger makes them: structured, formatted lazily, and
protected from storms.

A report (crash, supervisor, progress) becomes one ``logging.LogRecord`` whose ``otp_report``
attribute holds every field as data; its message text and its traceback are formatted only by
a handler that writes it (:func:`log_report` does no formatting, and a reason in the message is
rendered when the record is). :class:`BurstLimit` is OTP's handler burst limit
(``burst_limit_enable``, ``burst_limit_max_count`` 500, ``burst_limit_window_time`` 1 s): past
the limit a handler drops records, and logs how many it dropped once the window is over.
:func:`format_exception` is ``traceback.format_exception``'s text, with each frame's lines
formatted once per code location, so a restart storm of one bug pays for its traceback once.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from types import CodeType, TracebackType
from typing import Any

from ._reasons import format_reason

__all__ = ["BurstLimit", "ReportFormatter", "format_exception", "log_report"]

#: The logger that says how many records a burst limit dropped.
burst_logger = logging.getLogger("otp.logger")

# -- lazy text ----------------------------------------------------------------------------------


class _ReasonText:
    """An exit reason that becomes OTP's text only when a handler formats the message."""

    __slots__ = ("reason",)

    def __init__(self, reason: Any) -> None:
        self.reason = reason

    def __str__(self) -> str:
        return format_reason(self.reason)

    __repr__ = __str__


def reason_text(reason: Any) -> Any:
    """``reason`` as a message argument: ``format_reason`` runs when the record is formatted."""
    return reason if reason.__class__ is str else _ReasonText(reason)


def log_report(
    logger: logging.Logger,
    level: int,
    message: str,
    args: tuple[Any, ...],
    report: Mapping[str, Any],
    *,
    exc_info: BaseException | None = None,
) -> None:
    """Log ``report`` on ``logger``: one record with ``otp_report`` = the report's fields.

    Nothing is formatted here: ``message % args`` and the traceback of ``exc_info`` are left to
    the handlers that emit the record. The caller's file and line are not looked up (a report's
    origin is in its fields), which spares a walk of the stack per report. When no handler
    would take the record (only ``NullHandler`` s, or all above ``level``), none is made.
    """
    if not _taken(logger, level):
        return
    info = (type(exc_info), exc_info, exc_info.__traceback__) if exc_info is not None else None
    if logging.getLogRecordFactory() is _LogRecord and type(logger).makeRecord is _MAKE_RECORD:
        record = _record(logger.name, level, message, args, info, report)
    else:  # someone customised record making: go through it
        record = logger.makeRecord(
            logger.name, level, _NO_FILE, 0, message, args, info, extra={"otp_report": report}
        )
    logger.handle(record)


_LogRecord = logging.LogRecord
_MAKE_RECORD = logging.Logger.makeRecord
_NO_FILE = "(unknown file)"
#: What a LogRecord made for a report holds before its own fields are set (file, function,
#: line: a report's origin is in its fields, not in the code that logged it).
_TEMPLATE = vars(_LogRecord("", logging.INFO, _NO_FILE, 0, "", (), None))


def _record(
    name: str, level: int, message: str, args: tuple[Any, ...], info: Any, report: Any
) -> logging.LogRecord:
    """``LogRecord(...)`` with ``extra={"otp_report": report}``, the same fields (as
    ``logging.LogRecord.__init__`` sets them) made without recomputing the constant ones."""
    record = _LogRecord.__new__(_LogRecord)
    fields = record.__dict__
    fields.update(_TEMPLATE)
    now = time.time()
    fields["name"] = name
    fields["msg"] = message
    fields["args"] = args
    fields["levelname"] = logging.getLevelName(level)
    fields["levelno"] = level
    fields["exc_info"] = info
    fields["created"] = now
    fields["msecs"] = int((now - int(now)) * 1000) + 0.0
    fields["relativeCreated"] = (now - _START) * 1000
    if logging.logThreads:
        fields["thread"] = threading.get_ident()
        fields["threadName"] = threading.current_thread().name
    if logging.logMultiprocessing:
        multiprocessing = sys.modules.get("multiprocessing")
        if multiprocessing is not None:
            try:
                fields["processName"] = multiprocessing.current_process().name
            except Exception:
                pass
    if logging.logProcesses:
        fields["process"] = os.getpid()
    fields["otp_report"] = report
    return record


_START: float = getattr(logging, "_startTime", time.time())


def _taken(logger: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` on ``logger`` reaches a handler that may write it (as
    ``Logger.callHandlers`` walks; a logger filter counts as a taker, it may want to see it)."""
    if not logger.isEnabledFor(level) or logger.disabled:
        return False
    found = False
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return True
        for handler in current.handlers:
            found = True
            if handler.__class__ is not logging.NullHandler and level >= handler.level:
                return True
        if not current.propagate:
            break
        current = current.parent
    if found:
        return False
    last_resort = logging.lastResort  # what logging writes to when no handler is found
    return last_resort is not None and level >= last_resort.level


# -- tracebacks, formatted once per code location -------------------------------------------

#: (code, instruction offset) -> (the frame's formatted lines, file name, line, function).
_FrameText = tuple[str, str, int | None, str]
_FRAMES: dict[tuple[CodeType, int], _FrameText] = {}
#: Code locations cached before the cache starts over (a bound, not a tuning knob).
FRAME_CACHE_SIZE = 4096
_RECURSIVE_CUTOFF = 3  # traceback's own: identical frames shown before "[Previous line ...]"


def _frame_text(tb: TracebackType) -> _FrameText:
    key = (tb.tb_frame.f_code, tb.tb_lasti)
    cached = _FRAMES.get(key)
    if cached is None:
        # traceback's own rendering of this one entry (source line, carets and all).
        summary = traceback.extract_tb(tb, limit=1)
        frame = summary[0]
        cached = ("".join(summary.format()), frame.filename, frame.lineno, frame.name)
        if len(_FRAMES) >= FRAME_CACHE_SIZE:
            _FRAMES.clear()
        _FRAMES[key] = cached
    return cached


def _is_plain(exc: BaseException) -> bool:
    """Whether ``exc`` prints as one traceback and its message (no chain, group or syntax
    error, no ``sys.tracebacklimit``): the case :func:`format_exception` renders itself."""
    return (
        exc.__cause__ is None
        and (exc.__context__ is None or exc.__suppress_context__)
        and not isinstance(exc, SyntaxError | BaseExceptionGroup)
        and getattr(sys, "tracebacklimit", None) is None
    )


def format_exception(exc: BaseException) -> str:
    """``"".join(traceback.format_exception(exc))``, faster when the same code fails again.

    Each frame's lines are rendered by ``traceback`` the first time that code location appears
    and reused after; chained exceptions, exception groups and syntax errors go to
    ``traceback`` whole. The source lines are those of the first rendering (a file edited
    while the node runs shows its old line until the code is reloaded).
    """
    if not _is_plain(exc):
        return "".join(traceback.format_exception(exc))
    parts: list[str] = []
    tb = exc.__traceback__
    if tb is not None:
        parts.append("Traceback (most recent call last):\n")
        last: tuple[str, int | None, str] | None = None
        count = 0
        while tb is not None:
            text, filename, lineno, name = _frame_text(tb)
            tb = tb.tb_next
            if last != (filename, lineno, name):
                if count > _RECURSIVE_CUTOFF:
                    parts.append(_repeated(count - _RECURSIVE_CUTOFF))
                last = (filename, lineno, name)
                count = 0
            count += 1
            if count <= _RECURSIVE_CUTOFF:
                parts.append(text)
        if count > _RECURSIVE_CUTOFF:
            parts.append(_repeated(count - _RECURSIVE_CUTOFF))
    parts.append(_exception_only(exc))
    return "".join(parts)


def _exception_only(exc: BaseException) -> str:
    """``traceback.format_exception_only`` of a plain exception, without building a
    ``TracebackException`` (notes go to ``traceback``)."""
    if getattr(exc, "__notes__", None) is not None:
        return "".join(traceback.format_exception_only(exc))
    cls = type(exc)
    kind = cls.__qualname__
    module = cls.__module__
    if module not in ("__main__", "builtins"):
        kind = f"{module if isinstance(module, str) else '<unknown>'}.{kind}"
    try:
        text = str(exc)
    except Exception:
        text = "<exception str() failed>"
    return f"{kind}: {text}\n" if text else f"{kind}\n"


def _repeated(count: int) -> str:
    return f"  [Previous line repeated {count} more time{'s' if count > 1 else ''}]\n"


class ReportFormatter(logging.Formatter):
    """``logging.Formatter`` with the same output, cheaper on a storm: tracebacks through
    :func:`format_exception`, and the local time text computed once a second."""

    def __init__(self, fmt: str | None = None) -> None:
        super().__init__(fmt)
        self._second = -1
        self._second_text = ""

    def formatException(self, ei: Any) -> str:
        text = format_exception(ei[1])
        return text[:-1] if text.endswith("\n") else text

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        msec_format = self.default_msec_format
        if msec_format is None:
            return self._second_text
        return msec_format % (self._second_text, record.msecs)


# -- burst limit ----------------------------------------------------------------------------


class BurstLimit(logging.Filter):
    """OTP's handler burst limit: at most ``max_count`` records per ``window`` seconds.

    Add it to a handler (``handler.addFilter(BurstLimit(handler))``). A window opens with the
    first record after the last one ended; once ``max_count`` records passed in it, the rest
    are dropped (the handler's drop mode) until it ends. The first record after that is
    preceded by a WARNING from ``otp.logger`` with the count (``otp_report`` =
    ``{"dropped": n, "window_seconds": w, "max_count": m}``); :meth:`flush_dropped` writes the
    count without waiting for one (the node calls it when a window ends).

    This is the rule OTP's logger guide gives. OTP's ``logger_olp`` also starts its count over
    once its handler has had nothing to write for 100 ms, and does not count the record that
    opens a new window; this limit does neither (a storm with short pauses is still one burst
    here), and it logs the count it drops, which OTP's handlers do not.

    Args:
        handler: the handler it protects (the dropped count is written through it).
        max_count: records allowed per window (OTP's ``burst_limit_max_count``, 500).
        window: the window in seconds (OTP's ``burst_limit_window_time``, 1 s).
        clock: seconds on a monotonic clock (``time.monotonic``; tests pass trio's).
    """

    def __init__(
        self,
        handler: logging.Handler,
        max_count: int = 500,
        window: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # (a bool is an int to isinstance, but True is no count)
        if isinstance(max_count, bool) or not (isinstance(max_count, int) and max_count >= 1):
            raise ValueError(f"BurstLimit.max_count must be an int >= 1 (got {max_count!r})")
        if isinstance(window, bool) or not (isinstance(window, int | float) and window > 0):
            raise ValueError(f"BurstLimit.window must be a number of seconds > 0 (got {window!r})")
        super().__init__()
        self.handler = handler
        self.max_count = max_count
        self.window = float(window)
        self.clock = clock
        #: Records dropped in this window (not yet reported) and in all (for observers).
        self.dropped = 0
        self.dropped_total = 0
        #: Called (from the logging thread) when a window drops its first record: the node
        #: uses it to write the count when the window ends.
        self.on_dropping: Callable[[], None] | None = None
        self._window_start = -float("inf")
        self._count = 0
        # Threads log too (trio.to_thread); the counters change under this lock.
        self._lock = threading.Lock()

    @property
    def window_end(self) -> float:
        """When the current window ends (on ``clock``)."""
        return self._window_start + self.window

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == burst_logger.name and getattr(record, "otp_report", None) is not None:
            return True  # our own count always goes out
        now = self.clock()
        wake = None
        ended_with = 0
        with self._lock:
            if now - self._window_start >= self.window:
                # A new window: the last one's drops are reported before this record.
                ended_with, self.dropped = self.dropped, 0
                self._window_start = now
                self._count = 1
                passed = True
            elif self._count < self.max_count:
                self._count += 1
                return True
            else:
                self.dropped += 1
                self.dropped_total += 1
                if self.dropped == 1:
                    wake = self.on_dropping
                passed = False
        if wake is not None:
            wake()
        if ended_with:
            self._report(ended_with)
        return passed

    def flush_dropped(self) -> int:
        """Write the dropped count now if the window that dropped them has ended; returns it
        (0 when there was nothing to write, or the window still runs)."""
        now = self.clock()
        with self._lock:
            if not self.dropped or now - self._window_start < self.window:
                return 0
            dropped = self.dropped
            self.dropped = 0
        self._report(dropped)
        return dropped

    def _report(self, dropped: int) -> None:
        report = {"dropped": dropped, "window_seconds": self.window, "max_count": self.max_count}
        record = burst_logger.makeRecord(
            burst_logger.name,
            logging.WARNING,
            "(unknown file)",
            0,
            "burst limit: dropped %d log records (more than %d in %g s)",
            (dropped, self.max_count, self.window),
            None,
            extra={"otp_report": report},
        )
        self.handler.handle(record)
