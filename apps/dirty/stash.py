"""apps.dirty.stash: shared tables of the dirty pool, from web workers and dirty workers alike.

Gunicorn's ``gunicorn.dirty.stash`` API (``put``, ``get``, ``delete``, ``exists``, ``keys``,
``clear``, ``info``, ``ensure``, ``delete_table``, ``tables``, ``table``) with its errors, plus
atomic operations Gunicorn lacks: ``update_counter``, ``insert_new``, ``compare_and_set`` and a
per-key time to live (``put(..., ttl=s)``). Tables are ``otp.ets`` tables owned by actors under
the pool's supervisor. The module functions use :func:`apps.dirty.get_dirty_client`.
"""

from ._errors import StashError as StashError
from ._errors import StashKeyNotFoundError as StashKeyNotFoundError
from ._errors import StashTableNotFoundError as StashTableNotFoundError
from ._stash_client import ABSENT as ABSENT
from ._stash_client import StashClient as StashClient
from ._stash_client import StashTable as StashTable
from ._stash_client import clear as clear
from ._stash_client import compare_and_set as compare_and_set
from ._stash_client import delete as delete
from ._stash_client import delete_table as delete_table
from ._stash_client import ensure as ensure
from ._stash_client import exists as exists
from ._stash_client import get as get
from ._stash_client import info as info
from ._stash_client import insert_new as insert_new
from ._stash_client import keys as keys
from ._stash_client import put as put
from ._stash_client import table as table
from ._stash_client import tables as tables
from ._stash_client import update_counter as update_counter

__all__ = [
    "ABSENT",
    "StashClient",
    "StashError",
    "StashKeyNotFoundError",
    "StashTable",
    "StashTableNotFoundError",
    "clear",
    "compare_and_set",
    "delete",
    "delete_table",
    "ensure",
    "exists",
    "get",
    "info",
    "insert_new",
    "keys",
    "put",
    "table",
    "tables",
    "update_counter",
]
