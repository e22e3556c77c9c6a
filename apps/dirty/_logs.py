"""Log files, for USR1 (as Gunicorn reopens its logs after a rotation), in the node and in the
workers alike."""

from __future__ import annotations

import logging


def reopen_log_files() -> None:
    """Close every FileHandler of every logger (the root's and named ones); each reopens its
    file on its next record, so a rotated file is let go."""
    loggers: list[logging.Logger] = [logging.getLogger()]
    loggers += [
        log for log in logging.Logger.manager.loggerDict.values() if isinstance(log, logging.Logger)
    ]
    seen: set[int] = set()
    for log in loggers:
        for handler in log.handlers:
            if isinstance(handler, logging.FileHandler) and id(handler) not in seen:
                seen.add(id(handler))
                handler.acquire()
                try:
                    handler.close()
                finally:
                    handler.release()
