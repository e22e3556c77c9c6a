"""apps.matching: a pull-worker job server (the seed's "Dex"), its worker and client SDKs.

Workers never listen: they dial out to the server, register a stream per queue (one per flow
type, one for their own app worker id) and pull work. See ``ARCHITECTURE.md`` beside this file.

The server's names (``_SERVER``) load on first use: a worker or client program imports the SDK
alone (wire, trio, attrs), not the server's otp, supervisors and stores, which cost a process
start about 0.6 s of CPU more (a fleet of workers restarted often pays it each time).
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from ._application import application as application
    from ._application import default_application as default_application
    from ._config import MatchingConfig as MatchingConfig
    from ._config import add_arguments as add_arguments
    from ._observer import observer_view as observer_view

from ._asyncio_adapters import AsyncClient as AsyncClient
from ._asyncio_adapters import AsyncWorker as AsyncWorker
from ._blobs import BlobCache as BlobCache
from ._blocking_adapters import Client as Client
from ._blocking_adapters import Worker as Worker
from ._errors import AlreadyRegistered as AlreadyRegistered
from ._errors import AuthenticationError as AuthenticationError
from ._errors import BlobCorrupted as BlobCorrupted
from ._errors import BlobNotFound as BlobNotFound
from ._errors import CallTimeout as CallTimeout
from ._errors import Cancelled as Cancelled
from ._errors import ClientClosed as ClientClosed
from ._errors import ConfigurationError as ConfigurationError
from ._errors import Draining as Draining
from ._errors import FlowExists as FlowExists
from ._errors import FlowFailed as FlowFailed
from ._errors import FlowNotFound as FlowNotFound
from ._errors import HandlerError as HandlerError
from ._errors import InvalidBlobKey as InvalidBlobKey
from ._errors import LimitError as LimitError
from ._errors import MatchingError as MatchingError
from ._errors import NoWorkerAvailable as NoWorkerAvailable
from ._errors import ProtocolError as ProtocolError
from ._errors import PullRegistrationError as PullRegistrationError
from ._errors import Unavailable as Unavailable
from ._errors import UnknownFlowType as UnknownFlowType
from ._errors import UnknownName as UnknownName
from ._errors import WorkerStopped as WorkerStopped
from ._errors import error_from_code as error_from_code
from ._model import NOT_YET as NOT_YET
from ._model import Flow as Flow
from ._model import FlowDefinition as FlowDefinition
from ._model import FlowDescription as FlowDescription
from ._model import FlowStatus as FlowStatus
from ._model import FlowSummary as FlowSummary
from ._model import QueueSummary as QueueSummary
from ._model import Registry as Registry
from ._model import RetryPolicy as RetryPolicy
from ._model import RpcContext as RpcContext
from ._model import RpcDefinition as RpcDefinition
from ._model import StepContext as StepContext
from ._model import StepDefinition as StepDefinition
from ._model import apply_patch as apply_patch
from ._model import rpc as rpc
from ._model import state_patch as state_patch
from ._model import step as step
from ._model import subflow as subflow
from ._model import wait_for as wait_for
from ._options import ClientOptions as ClientOptions
from ._options import PullWorkerOptions as PullWorkerOptions
from ._options import ServerAddress as ServerAddress
from ._options import WorkerOptions as WorkerOptions
from ._options import parse_server_address as parse_server_address
from ._readiness import PullRegistrationState as PullRegistrationState
from ._readiness import QueueRegistrationState as QueueRegistrationState
from ._readiness_probe import readiness_handler as readiness_handler
from ._readiness_probe import serve_readyz as serve_readyz
from ._trio_adapters import TrioClient as TrioClient
from ._trio_adapters import TrioWorker as TrioWorker

__all__ = [
    "AlreadyRegistered",
    "AsyncClient",
    "AsyncWorker",
    "AuthenticationError",
    "BlobCache",
    "BlobCorrupted",
    "BlobNotFound",
    "CallTimeout",
    "Cancelled",
    "Client",
    "ClientClosed",
    "ClientOptions",
    "ConfigurationError",
    "Draining",
    "Flow",
    "FlowDefinition",
    "FlowDescription",
    "FlowExists",
    "FlowFailed",
    "FlowNotFound",
    "FlowStatus",
    "FlowSummary",
    "HandlerError",
    "InvalidBlobKey",
    "LimitError",
    "MatchingConfig",
    "MatchingError",
    "NOT_YET",
    "NoWorkerAvailable",
    "ProtocolError",
    "PullRegistrationError",
    "PullRegistrationState",
    "PullWorkerOptions",
    "QueueRegistrationState",
    "QueueSummary",
    "Registry",
    "RetryPolicy",
    "RpcContext",
    "RpcDefinition",
    "ServerAddress",
    "StepContext",
    "StepDefinition",
    "TrioClient",
    "TrioWorker",
    "Unavailable",
    "UnknownFlowType",
    "UnknownName",
    "Worker",
    "WorkerOptions",
    "WorkerStopped",
    "add_arguments",
    "application",
    "apply_patch",
    "default_application",
    "error_from_code",
    "observer_view",
    "parse_server_address",
    "readiness_handler",
    "rpc",
    "serve_readyz",
    "state_patch",
    "step",
    "subflow",
    "wait_for",
]

#: The server's names, by the module each loads from on first use (see the module's doc).
_SERVER = {
    "application": "._application",
    "default_application": "._application",
    "MatchingConfig": "._config",
    "add_arguments": "._config",
    "observer_view": "._observer",
}


def _name_the_facade(obj: typing.Any) -> None:
    if isinstance(obj, type) or callable(obj):
        try:
            obj.__module__ = "apps.matching"
        except (AttributeError, TypeError):  # pragma: no cover
            pass


def __getattr__(name: str) -> typing.Any:
    module = _SERVER.get(name)
    if module is None:
        raise AttributeError(f"module 'apps.matching' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    _name_the_facade(value)
    globals()[name] = value
    return value


for _name in __all__:
    if _name not in _SERVER:
        _name_the_facade(globals()[_name])
del _name
