"""``python -m otp.node``: boot a node (see ``--help``)."""

from ._main import main

raise SystemExit(main(own_process=True))
