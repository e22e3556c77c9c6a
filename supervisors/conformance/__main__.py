"""``python -m supervisors.conformance FILE.json [...] [--check]``."""

import sys

from ._main import main

sys.exit(main())
