"""Entry point of a dirty worker process: ``python -m apps.dirty._worker_main SPEC_JSON``."""

from __future__ import annotations

import sys

from apps.dirty._worker import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
