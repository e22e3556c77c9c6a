"""otp.observer: snapshots of a running node (processes, ETS tables, ports, connections), as
frozen records of plain values, cheap enough to take every second.

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

__all__ = [
    "NodeConnection",
    "NodeSnapshot",
    "PortSnapshot",
    "ProcessSnapshot",
    "observe_connections",
    "observe_ports",
    "observe_process",
    "observe_processes",
    "observe_tables",
    "snapshot",
]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
