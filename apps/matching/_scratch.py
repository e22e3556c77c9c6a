"""A temporary directory owned by a supervised process: made when it starts, removed when it
stops.

The embedded default node keeps its flows in a SQLite file of its own; without an owner that
file's directory would outlive every boot. As the first child of ``matching_sup`` (rest_for_one)
the owner starts before the store and stops after it, so the directory exists for as long as
anything reads or writes it and is gone once the server has stopped. (A node killed with
SIGKILL cannot clean up; its directory stays, named for it, in the temporary directory.)
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import otp

__all__ = ["ScratchDirectory"]


class ScratchDirectory(otp.GenServer):
    """``ScratchDirectory.start_link(path)``: make ``path`` (mode 0700, its parents as needed);
    remove it with everything in it when the process stops."""

    async def init(self, path: str) -> otp.Ok:
        otp.process_flag(trap_exit=True)  # (so terminate runs when the supervisor stops us)
        os.makedirs(path, mode=0o700, exist_ok=True)
        return otp.Ok(path)

    async def terminate(self, reason: Any, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)
