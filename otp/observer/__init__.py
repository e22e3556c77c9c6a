"""otp.observer: snapshots of a running node (processes, ETS tables, ports, connections), as
frozen records of plain values, cheap enough to take every second; and attaching to another
node as a hidden node to ask its observer agent for them (``python -m otp.observer``, with
``--top`` for a table of its busiest processes).

The supervision tree and the applications' own views are ``supervisors.observe()``: this layer
does not know supervisors.
"""

from .._observer import NodeConnection as NodeConnection
from .._observer import NodeSnapshot as NodeSnapshot
from .._observer import PortSnapshot as PortSnapshot
from .._observer import ProcessSnapshot as ProcessSnapshot
from .._observer import observe_connections as observe_connections
from .._observer import observe_ports as observe_ports
from .._observer import observe_process as observe_process
from .._observer import observe_processes as observe_processes
from .._observer import observe_tables as observe_tables
from .._observer import snapshot as snapshot
from ._remote import AGENT_NAME as AGENT_NAME
from ._remote import AttachError as AttachError
from ._remote import RemoteNode as RemoteNode
from ._remote import attach as attach
from ._top import Top as Top
from ._top import TopRow as TopRow
from ._top import render as render_top
from ._top import top as top

__all__ = [
    "AGENT_NAME",
    "AttachError",
    "NodeConnection",
    "NodeSnapshot",
    "PortSnapshot",
    "ProcessSnapshot",
    "RemoteNode",
    "Top",
    "TopRow",
    "attach",
    "observe_connections",
    "observe_ports",
    "observe_process",
    "observe_processes",
    "observe_tables",
    "render_top",
    "snapshot",
    "top",
]

for _name in __all__:
    if not isinstance(globals()[_name], str):
        globals()[_name].__module__ = __name__
del _name
