"""apps.dirty: a Gunicorn-style dirty worker pool as a supervision tree, wire-compatible with
Gunicorn 27's dirty arbiter (GD v1 on a Unix socket, ``GUNICORN_DIRTY_SOCKET``).

Web workers (any WSGI/ASGI server) offload blocking, heavy or stateful work to ``DirtyApp``
instances living in worker OS processes::

    # myapp/ml.py
    from apps.dirty import DirtyApp

    class MLApp(DirtyApp):
        workers = 2                      # at most 2 workers load it
        def init(self):                  # once per worker process
            self.model = {"w": 3}
        def predict(self, x):
            return x * self.model["w"]
        def tokens(self, text):          # a generator streams CHUNK frames
            yield from text.split()

    # run the pool:
    #   python -m otp.node --app apps.dirty --dirty-app myapp.ml:MLApp --dirty-workers 4
    # in the web app:
    from apps.dirty import get_dirty_client
    client = get_dirty_client()          # GUNICORN_DIRTY_SOCKET names the socket
    client.execute("myapp.ml:MLApp", "predict", 14)             # -> 42
    for token in client.stream("myapp.ml:MLApp", "tokens", "a b c"): ...

The tree (``dirty_sup``, rest_for_one): stash (table owners), connections (one process per
client), pool (one worker proxy + port per OS process), router (app -> workers, scaling,
reload), signals, listener (owns the socket; its acceptor starts the connections). Signals:
TERM/INT drain (the node's), QUIT stops at once, HUP replaces every worker, USR1 reopens logs,
TTIN/TTOU add/remove a worker. Gunicorn's own ``gunicorn.dirty`` client works against it
unchanged.
"""

from . import examples as examples
from . import stash as stash
from ._app import AppSpec as AppSpec
from ._app import DirtyApp as DirtyApp
from ._app import DirtyWorkerInfo as DirtyWorkerInfo
from ._app import load_dirty_app as load_dirty_app
from ._app import parse_dirty_app_spec as parse_dirty_app_spec
from ._application import application as application
from ._application import default_application as default_application
from ._client import DirtyClient as DirtyClient
from ._client import close_dirty_client as close_dirty_client
from ._client import close_dirty_client_async as close_dirty_client_async
from ._client import get_dirty_client as get_dirty_client
from ._client import get_dirty_client_async as get_dirty_client_async
from ._client import get_dirty_socket_path as get_dirty_socket_path
from ._client import set_dirty_socket_path as set_dirty_socket_path
from ._config import DirtyConfig as DirtyConfig
from ._config import add_arguments as add_arguments
from ._config import apps_for_new_worker as apps_for_new_worker
from ._config import initial_allocation as initial_allocation
from ._config import minimum_workers as minimum_workers
from ._context import PoolContext as PoolContext
from ._errors import DirtyAppError as DirtyAppError
from ._errors import DirtyAppNotFoundError as DirtyAppNotFoundError
from ._errors import DirtyConfigError as DirtyConfigError
from ._errors import DirtyConnectionError as DirtyConnectionError
from ._errors import DirtyError as DirtyError
from ._errors import DirtyNoWorkersAvailableError as DirtyNoWorkersAvailableError
from ._errors import DirtyProtocolError as DirtyProtocolError
from ._errors import DirtyTimeoutError as DirtyTimeoutError
from ._errors import DirtyWorkerError as DirtyWorkerError
from ._errors import StashError as StashError
from ._errors import StashKeyNotFoundError as StashKeyNotFoundError
from ._errors import StashTableNotFoundError as StashTableNotFoundError
from ._observer import observer_view as observer_view

__all__ = [
    "AppSpec",
    "DirtyApp",
    "DirtyAppError",
    "DirtyAppNotFoundError",
    "DirtyClient",
    "DirtyConfig",
    "DirtyConfigError",
    "DirtyConnectionError",
    "DirtyError",
    "DirtyNoWorkersAvailableError",
    "DirtyProtocolError",
    "DirtyTimeoutError",
    "DirtyWorkerError",
    "DirtyWorkerInfo",
    "PoolContext",
    "StashError",
    "StashKeyNotFoundError",
    "StashTableNotFoundError",
    "add_arguments",
    "application",
    "default_application",
    "apps_for_new_worker",
    "close_dirty_client",
    "close_dirty_client_async",
    "get_dirty_client",
    "get_dirty_client_async",
    "get_dirty_socket_path",
    "set_dirty_socket_path",
    "initial_allocation",
    "load_dirty_app",
    "minimum_workers",
    "observer_view",
    "parse_dirty_app_spec",
    "examples",
    "stash",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type) or callable(_obj):
        _obj.__module__ = __name__
del _name, _obj
