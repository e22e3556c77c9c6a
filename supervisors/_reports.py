"""Structured supervisor reports through ``logging`` (OTP's progress and supervisor reports).

Every record carries ``extra={"otp_report": {...}}`` with OTP's fields, so handlers can format
or ship them; the message text reads like OTP's report. Loggers: ``supervisors.progress``
(child started, INFO) and ``supervisors`` (child_terminated, start_error, shutdown_error,
reached_max_restart_intensity, ERROR; application events).
"""

from __future__ import annotations

import logging
from typing import Any

import otp

from ._spec import ChildSpec

logger = logging.getLogger("supervisors")
progress_logger = logging.getLogger("supervisors.progress")
# A library does not print on its own: without an application handler, records go nowhere.
logger.addHandler(logging.NullHandler())

CHILD_TERMINATED = "child_terminated"
START_ERROR = "start_error"
SHUTDOWN_ERROR = "shutdown_error"
SHUTDOWN = "shutdown"
REACHED_MAX_RESTART_INTENSITY = "reached_max_restart_intensity"


def report_progress(supervisor: Any, spec: ChildSpec, pid: otp.Pid) -> None:
    """A child was started (OTP's progress report)."""
    if progress_logger.isEnabledFor(logging.INFO):
        otp.log_report(
            progress_logger,
            logging.INFO,
            "supervisor %r started child %r as %r",
            (supervisor, spec.id, pid),
            {
                "supervisor": supervisor,
                "started": {"id": spec.id, "pid": pid, "type": str(spec.type)},
            },
        )


def report_error(
    context: str, reason: Any, supervisor: Any, spec: ChildSpec | None, pid: Any = None
) -> None:
    """A supervisor report: ``context`` is child_terminated, start_error, shutdown_error or
    shutdown (for reached_max_restart_intensity). The reason is formatted only by a handler
    that writes the record."""
    if not logger.isEnabledFor(logging.ERROR):
        return
    child = (
        {"id": spec.id, "pid": pid, "restart": str(spec.restart), "type": str(spec.type)}
        if spec is not None
        else None
    )
    otp.log_report(
        logger,
        logging.ERROR,
        "supervisor %r: %s, reason %s, offender %r",
        (supervisor, context, otp.reason_text(reason), child),
        {"supervisor": supervisor, "errorContext": context, "reason": reason, "offender": child},
    )
