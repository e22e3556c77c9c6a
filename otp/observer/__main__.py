"""``python -m otp.observer --node a@host --connect ADDRESS --cookie-file FILE [--top]``:
attach to a running node as a hidden node and show it (see ``--help``).

An entry point, run and never imported: it sits above the layers it runs (the web observer is
``otp.node``'s).
"""

from otp.node import serve_remote_observer

from ._cli import main

raise SystemExit(main(serve_web=serve_remote_observer))
