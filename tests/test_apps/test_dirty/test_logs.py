"""USR1's log reopening: every FileHandler, on the root logger and on named loggers."""

from __future__ import annotations

import logging
from pathlib import Path

from apps.dirty._logs import reopen_log_files


def test_file_handlers_of_root_and_named_loggers_move_to_the_new_file(tmp_path: Path) -> None:
    root_file, named_file = tmp_path / "root.log", tmp_path / "named.log"
    root_handler = logging.FileHandler(root_file)
    named_handler = logging.FileHandler(named_file)
    named = logging.getLogger("test_logs.app")
    named.propagate = False
    logging.getLogger().addHandler(root_handler)
    named.addHandler(named_handler)
    try:
        logging.getLogger().warning("before")
        named.warning("before")
        # logrotate moves the files away, then USR1 comes.
        root_file.rename(tmp_path / "root.log.1")
        named_file.rename(tmp_path / "named.log.1")
        reopen_log_files()
        logging.getLogger().warning("after")
        named.warning("after")
        assert (tmp_path / "root.log.1").read_text() == "before\n"
        assert (tmp_path / "named.log.1").read_text() == "before\n"
        assert root_file.read_text() == "after\n"
        assert named_file.read_text() == "after\n"
    finally:
        logging.getLogger().removeHandler(root_handler)
        named.removeHandler(named_handler)
        root_handler.close()
        named_handler.close()
