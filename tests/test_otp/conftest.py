"""Fixtures shared by the otp tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def sockets(tmp_path: Path) -> Any:
    return lambda name: f"unix:{tmp_path / name}.sock"
