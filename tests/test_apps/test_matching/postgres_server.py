"""A real PostgreSQL server for the tests: ``benchmarks/_matching_processes.py``'s (a throwaway
data directory, a free loopback port, run as a non-root user, ``postgres`` when the tests run as
root, as on CI), the one the matching benchmarks start too.

``.ci/run`` installs Debian's ``postgresql`` package and sets ``OTP_REQUIRE_POSTGRES=1``, so
there a missing server is a failure; elsewhere the PostgreSQL tests are skipped, saying how to
run them (README: "Every matching test that reaches a store").
"""

from __future__ import annotations

import os

import pytest

from benchmarks import _matching_processes

REQUIRED = os.environ.get("OTP_REQUIRE_POSTGRES") == "1"


class PostgresServer(_matching_processes.PostgresServer):
    """``start()`` an initdb'd server (skipped, or failed on CI, when none is installed);
    ``with schema() as url`` (or ``url()``) for a fresh schema in it; ``stop()``."""

    def start(self) -> None:
        try:
            super().start()
        except _matching_processes.PostgresMissing as exc:
            message = f"{exc} to run these tests"
            if REQUIRED:
                pytest.fail(message)
            pytest.skip(message)
