"""otp: Erlang/OTP's processes, signals, links, monitors, registry, timers and gen_server on trio.

The public API; everything lives in private modules and is re-exported here.
"""

from ._api import add_exit_hook as add_exit_hook
from ._api import cancel_timer as cancel_timer
from ._api import demonitor as demonitor
from ._api import exit as exit
from ._api import exit_after as exit_after
from ._api import exit_self as exit_self
from ._api import link as link
from ._api import make_ref as make_ref
from ._api import monitor as monitor
from ._api import process_flag as process_flag
from ._api import read_timer as read_timer
from ._api import receive as receive
from ._api import register as register
from ._api import registered as registered
from ._api import self as self
from ._api import send as send
from ._api import send_after as send_after
from ._api import spawn as spawn
from ._api import spawn_link as spawn_link
from ._api import spawn_monitor as spawn_monitor
from ._api import unlink as unlink
from ._api import unregister as unregister
from ._api import whereis as whereis
from ._dist_config import DistConfig as DistConfig
from ._dist_config import DistributionError as DistributionError
from ._dist_config import TlsConfig as TlsConfig
from ._dist_config import read_cookie_file as read_cookie_file
from ._dist_records import remote_value as remote_value
from ._dist_values import RemoteException as RemoteException
from ._distribution import NodeDown as NodeDown
from ._distribution import connect as connect
from ._distribution import disconnect as disconnect
from ._distribution import monitor_node as monitor_node
from ._distribution import node_name as node_name
from ._distribution import nodes as nodes
from ._distribution import start_distribution as start_distribution
from ._errors import BadArg as BadArg
from ._errors import CallError as CallError
from ._errors import CallTimeout as CallTimeout
from ._errors import NoProc as NoProc
from ._errors import NotAProcess as NotAProcess
from ._errors import OtpError as OtpError
from ._errors import ProcessExited as ProcessExited
from ._errors import ReceiveTimeout as ReceiveTimeout
from ._errors import StartError as StartError
from ._errors import StartIgnored as StartIgnored
from ._errors import StopError as StopError
from ._gen_server import GenServer as GenServer
from ._gen_server import call as call
from ._gen_server import cast as cast
from ._gen_server import reply as reply
from ._gen_server_returns import Ignore as Ignore
from ._gen_server_returns import NoReply as NoReply
from ._gen_server_returns import Ok as Ok
from ._gen_server_returns import Reply as Reply
from ._gen_server_returns import Stop as Stop
from ._ids import Pid as Pid
from ._ids import Ref as Ref
from ._info import ProcessInfo as ProcessInfo
from ._info import is_process_alive as is_process_alive
from ._info import message_queue_len as message_queue_len
from ._info import process_info as process_info
from ._info import processes as processes
from ._logger import BurstLimit as BurstLimit
from ._logger import ReportFormatter as ReportFormatter
from ._logger import format_exception as format_exception
from ._logger import log_report as log_report
from ._logger import reason_text as reason_text
from ._messages import Down as Down
from ._messages import Exit as Exit
from ._messages import From as From
from ._node import Node as Node
from ._node import current_node as current_node
from ._node import open_node as open_node
from ._node import run as run
from ._port import ExitStatus as ExitStatus
from ._port import PortData as PortData
from ._port import PortSpec as PortSpec
from ._port import Signaled as Signaled
from ._port import open_port as open_port
from ._port import port_close as port_close
from ._port import port_command as port_command
from ._port import port_os_pid as port_os_pid
from ._process import ProcessExit as ProcessExit
from ._reasons import KILL as KILL
from ._reasons import KILLED as KILLED
from ._reasons import NOCONNECTION as NOCONNECTION
from ._reasons import NOPROC as NOPROC
from ._reasons import NORMAL as NORMAL
from ._reasons import SHUTDOWN as SHUTDOWN
from ._reasons import BadReturnValue as BadReturnValue
from ._reasons import Crash as Crash
from ._reasons import Shutdown as Shutdown
from ._reasons import format_reason as format_reason
from ._reasons import is_abnormal as is_abnormal
from ._request import Response as Response
from ._request import send_request as send_request
from ._unix_socket import SocketPathTaken as SocketPathTaken
from ._unix_socket import claim_socket_path as claim_socket_path

__all__ = [
    "KILL",
    "KILLED",
    "NOCONNECTION",
    "NOPROC",
    "NORMAL",
    "SHUTDOWN",
    "BadArg",
    "BadReturnValue",
    "BurstLimit",
    "CallError",
    "CallTimeout",
    "Crash",
    "DistConfig",
    "DistributionError",
    "Down",
    "Exit",
    "ExitStatus",
    "From",
    "GenServer",
    "Ignore",
    "NoProc",
    "NoReply",
    "Node",
    "NodeDown",
    "NotAProcess",
    "Ok",
    "OtpError",
    "Pid",
    "PortData",
    "PortSpec",
    "ProcessExit",
    "ProcessExited",
    "ProcessInfo",
    "ReceiveTimeout",
    "Ref",
    "RemoteException",
    "Reply",
    "ReportFormatter",
    "Response",
    "Shutdown",
    "Signaled",
    "SocketPathTaken",
    "StartError",
    "StartIgnored",
    "Stop",
    "StopError",
    "TlsConfig",
    "add_exit_hook",
    "call",
    "cancel_timer",
    "cast",
    "claim_socket_path",
    "connect",
    "current_node",
    "demonitor",
    "disconnect",
    "exit",
    "exit_after",
    "exit_self",
    "format_exception",
    "format_reason",
    "is_abnormal",
    "link",
    "log_report",
    "make_ref",
    "message_queue_len",
    "monitor",
    "monitor_node",
    "node_name",
    "nodes",
    "open_node",
    "observer",
    "open_port",
    "pg",
    "port_close",
    "port_command",
    "port_os_pid",
    "process_flag",
    "process_info",
    "processes",
    "is_process_alive",
    "read_cookie_file",
    "read_timer",
    "reason_text",
    "receive",
    "register",
    "registered",
    "remote_value",
    "reply",
    "send_request",
    "run",
    "self",
    "send",
    "send_after",
    "spawn",
    "spawn_link",
    "spawn_monitor",
    "start_distribution",
    "unlink",
    "unregister",
    "whereis",
]


from . import observer as observer  # the subpackages need the names above
from . import pg as pg


def _publish() -> None:
    # Public objects say they come from ``otp``, not from the private module that defines them.
    for name in __all__:
        obj = globals()[name]
        if (isinstance(obj, type) or callable(obj)) and not isinstance(obj, type(pg)):
            try:
                obj.__module__ = __name__
            except (AttributeError, TypeError):
                pass


_publish()
del _publish
