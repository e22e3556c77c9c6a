"""``python -m apps.matching``: the matching server's client CLI (see ``_cli.py``)."""

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
