"""otp.pg: process groups across connected nodes, as Erlang's ``pg`` module."""

from .._pg import PgJoin as PgJoin
from .._pg import PgLeave as PgLeave
from .._pg import demonitor as demonitor
from .._pg import get_local_members as get_local_members
from .._pg import get_members as get_members
from .._pg import join as join
from .._pg import leave as leave
from .._pg import monitor as monitor
from .._pg import monitor_scope as monitor_scope
from .._pg import which_groups as which_groups

__all__ = [
    "PgJoin",
    "PgLeave",
    "demonitor",
    "get_local_members",
    "get_members",
    "join",
    "leave",
    "monitor",
    "monitor_scope",
    "which_groups",
]

for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
