"""Entry point of a dirty worker process: ``python -m apps.dirty.worker SPEC_JSON``."""

from __future__ import annotations

import sys

from ._main import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
