"""Audit of the dirty pool's settings, app loading and the stash's server side.

Against Gunicorn 27.0.1 (``gunicorn/config.py``'s dirty_* settings and hooks,
``gunicorn/dirty/app.py``, the arbiter's stash) and what a production user expects: a bad
setting is refused up front with a typed error naming it, never a bare TypeError or a worker
that cannot start; a stash write is readable back or refused, never silently altered.
Pure functions where the code allows it; the stash on a node running only its supervisor.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import otp
import wire
from apps import dirty
from apps.dirty import _application, _connection, _protocol, _proxy_start
from apps.dirty import _stash as stash_server
from apps.dirty._protocol import ERROR, RESPONSE
from apps.dirty.worker import _main as worker_main
from otp import ets, node

from .conftest import ECHO

HERE = "tests.test_apps.test_dirty.test_audit_config"
HOOKS = "tests.test_apps.test_dirty.dirty_hooks"


# ------------------------------------------------------------------------ apps and hooks


class CallOnly:
    """Callable, but not a DirtyApp: no init() or close() (the worker calls both)."""

    def __call__(self, action: str, *args: Any, **kwargs: Any) -> Any:
        return action


class RaisesInInit(dirty.DirtyApp):
    def __init__(self) -> None:
        raise RuntimeError("constructor boom")


class BadStashes(dirty.DirtyApp):
    stashes = 5  # type: ignore[assignment]


def two_arg_worker_init(worker: Any, extra: Any) -> None:
    """A dirty_worker_init of the wrong arity (the worker calls it with one argument)."""


def _outer() -> Any:
    def local_hook(info: Any) -> None:
        pass

    return local_hook


def _settings(**table: Any) -> node.NodeConfig:
    return node.NodeConfig(settings={"dirty": table})


# ------------------------------------------------------------------------ settings


@pytest.mark.parametrize("kind", ["relative", "raises", "syntax"])
def test_an_app_module_that_cannot_be_imported_is_a_config_error(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"audit_cfg_bad_{kind}"
    body = {"raises": "raise RuntimeError('no GPU')\n", "syntax": "def broken(:\n"}
    if kind == "relative":
        spec = ".audit_cfg_rel:App"
    else:
        (tmp_path / f"{name}.py").write_text(body[kind])
        spec = f"{name}:App"
    with pytest.raises(dirty.DirtyConfigError, match="dirty_apps"):
        dirty.application(_settings(dirty_apps=[spec]))


def test_a_limited_app_spec_with_a_missing_module_is_a_config_error() -> None:
    with pytest.raises(dirty.DirtyConfigError, match="no_such_dirty_audit_mod"):
        dirty.application(_settings(dirty_apps=["no_such_dirty_audit_mod:App:2"]))


def test_a_missing_module_without_a_count_is_a_config_error() -> None:
    """The contrast to the test above: the unlimited form is checked up front."""
    with pytest.raises(dirty.DirtyConfigError, match="dirty_apps: cannot import module"):
        dirty.application(_settings(dirty_apps=["no_such_dirty_audit_mod:App"]))


@pytest.mark.parametrize("spec", ["os:getcwd", f"{HERE}:CallOnly"])
def test_an_app_without_dirty_app_methods_is_refused_with_the_config(spec: str) -> None:
    with pytest.raises(dirty.DirtyConfigError, match="init"):
        dirty.application(_settings(dirty_apps=[spec]))


@pytest.mark.parametrize(
    ("spec", "message"),
    [("os:getcwd", "init"), (f"{HERE}:CallOnly", "init"), (f"{HERE}:RaisesInInit", "boom")],
    ids=["function", "call-only-class", "constructor-raises"],
)
def test_load_dirty_app_refuses_what_cannot_be_a_dirty_app(spec: str, message: str) -> None:
    with pytest.raises(dirty.DirtyAppError, match=message) as info:
        dirty.load_dirty_app(spec)
    assert info.value.app_path == spec


def test_an_app_whose_stashes_is_not_a_list_is_a_typed_error() -> None:
    with pytest.raises(dirty.DirtyError, match="stashes"):
        app = dirty.application(_settings(dirty_apps=[f"{HERE}:BadStashes"]))
        _application.dirty_supervisor_spec(app.root[1])


@pytest.mark.parametrize("table", [5, "x", [1]])
def test_a_dirty_section_that_is_not_a_table_is_a_config_error(table: Any) -> None:
    with pytest.raises(dirty.DirtyConfigError, match=r"\[dirty\]"):
        dirty.DirtyConfig.from_settings({"dirty": table})


def test_the_default_application_refuses_a_dirty_section_that_is_not_a_table() -> None:
    # (python -m otp.node with no --app: before, a bare TypeError from dict(5))
    with pytest.raises(dirty.DirtyConfigError, match=r"\[dirty\]"):
        dirty.default_application(node.NodeConfig(settings={"dirty": 5}))


@pytest.mark.parametrize("value", [5, ".relative", "raising"])
def test_a_bad_dirty_config_module_is_a_config_error(
    value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value == "raising":
        monkeypatch.syspath_prepend(str(tmp_path))
        (tmp_path / "audit_cfg_hooks_raising.py").write_text("raise RuntimeError('bad')\n")
        value = "audit_cfg_hooks_raising"
    with pytest.raises(dirty.DirtyConfigError, match="dirty_config"):
        dirty.DirtyConfig.from_settings({"dirty": {"dirty_apps": [ECHO], "dirty_config": value}})


@pytest.mark.parametrize("path", [":dirty_worker_init", ".dirty_hooks:dirty_worker_init"])
def test_a_hook_path_with_an_empty_or_relative_module_is_a_config_error(path: str) -> None:
    with pytest.raises(dirty.DirtyConfigError, match="dirty_worker_init"):
        dirty.DirtyConfig(hooks={"dirty_worker_init": path})


def test_hooks_that_are_not_a_mapping_are_a_config_error() -> None:
    with pytest.raises(dirty.DirtyConfigError, match="hooks"):
        dirty.DirtyConfig(hooks=["on_dirty_starting"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "hook",
    [f"{HOOKS}:dirty_post_fork", f"{HERE}:two_arg_worker_init", two_arg_worker_init],
    ids=["path-2-args", "path-here", "callable"],
)
def test_a_dirty_worker_init_hook_of_the_wrong_arity_is_refused(hook: Any) -> None:
    with pytest.raises(dirty.DirtyConfigError, match="dirty_worker_init"):
        dirty.DirtyConfig(hooks={"dirty_worker_init": hook})


@pytest.mark.parametrize(
    "hook",
    [
        lambda info: None,
        _outer(),
        functools.partial(two_arg_worker_init, None),
        CallOnly(),
    ],
    ids=["lambda", "local", "partial", "callable-object"],
)
def test_a_callable_dirty_worker_init_hook_reaches_the_worker_or_is_refused(hook: Any) -> None:
    try:
        config = dirty.DirtyConfig(hooks={"dirty_worker_init": hook})
    except dirty.DirtyConfigError as exc:  # refused up front, naming it: fine
        assert "dirty_worker_init" in str(exc)
        return
    # What the worker process does with the path the pool passes it in its JSON spec.
    loaded = worker_main._load_hook(_proxy_start._hook_path(config, "dirty_worker_init"))
    assert loaded is not None


def test_a_dirty_worker_init_defined_in_main_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Importable as ``__main__:fn`` in the node, but the worker's ``__main__`` is its own."""

    def main_hook(info: Any) -> None:
        pass

    main_hook.__module__ = "__main__"
    main_hook.__qualname__ = "audit_main_hook"
    monkeypatch.setattr(sys.modules["__main__"], "audit_main_hook", main_hook, raising=False)
    with pytest.raises(dirty.DirtyConfigError, match="dirty_worker_init runs in the worker"):
        dirty.DirtyConfig(hooks={"dirty_worker_init": main_hook})


def test_node_side_hooks_may_be_any_callable_of_the_right_arity() -> None:
    """Only dirty_worker_init crosses to the worker; the others run in the node."""
    config = dirty.DirtyConfig(
        hooks={
            "on_dirty_starting": lambda ctx: None,
            "dirty_post_fork": functools.partial(two_arg_worker_init),
        }
    )
    assert config.hook("dirty_post_fork") is config.hooks["dirty_post_fork"]
    with pytest.raises(dirty.DirtyConfigError, match=r"on_dirty_starting is called with \(ctx\)"):
        dirty.DirtyConfig(hooks={"on_dirty_starting": two_arg_worker_init})


def test_the_same_app_in_both_forms_is_refused_naming_dirty_apps() -> None:
    with pytest.raises(dirty.DirtyConfigError, match="dirty_apps names an app twice"):
        dirty.DirtyConfig(dirty_apps=[ECHO, f"{ECHO}:2"])


def test_a_count_in_the_spec_wins_over_a_bad_class_attribute_and_hooks_by_path_load() -> None:
    """``module:Class:N`` never reads ``workers`` (so a class with ``workers = 0`` is usable
    with a count); a module-level callable hook round-trips to the worker by path."""
    config = dirty.DirtyConfig(
        dirty_apps=[f"{HERE}:BadWorkers:2"],
        dirty_workers=2,
        hooks={"dirty_worker_init": f"{HOOKS}:dirty_worker_init"},
    )
    assert config.dirty_apps == (dirty.AppSpec(f"{HERE}:BadWorkers", 2),)
    with pytest.raises(dirty.DirtyConfigError, match=r"BadWorkers.workers must be an int >= 1"):
        dirty.DirtyConfig(dirty_apps=[f"{HERE}:BadWorkers"])
    from tests.test_apps.test_dirty import dirty_hooks

    fn_config = dirty.DirtyConfig(hooks={"dirty_worker_init": dirty_hooks.dirty_worker_init})
    path = _proxy_start._hook_path(fn_config, "dirty_worker_init")
    assert worker_main._load_hook(path) is dirty_hooks.dirty_worker_init


class BadWorkers(dirty.DirtyApp):
    workers = 0


# ------------------------------------------------------------------------ the stash


async def _stash(
    op: int, table: str, key: Any = None, value: Any = None, pattern: str | None = None
) -> tuple[int, Any]:
    """One STASH as a client sends it; the reply's (type, body)."""
    payload = _protocol.encode(wire.make_stash(3, op, table, key, value, pattern))[16:]
    [(mtype, _rid, body)] = wire.FrameSplitter().feed(await _connection._stash(3, payload))
    return mtype, _protocol.decode_payload(body)


async def _result(op: int, table: str, **kw: Any) -> Any:
    mtype, body = await _stash(op, table, **kw)
    assert mtype == RESPONSE, body
    return body["result"]


PUT, GET, DELETE, KEYS, INFO, ENSURE, DELETE_TABLE, TABLES, EXISTS = 1, 2, 3, 4, 6, 7, 8, 9, 10
INCR, INSERT_NEW, CAS, PUT_TTL = 11, 12, 13, 14


@pytest.fixture
async def stash_node() -> Any:
    """A node running only the pool's stash (its supervisor, tables and manager)."""
    async with otp.open_node():
        await _application._start_stash_sup(("declared",))
        yield


@pytest.mark.parametrize("op", [INCR, INSERT_NEW, CAS, PUT_TTL])
async def test_an_extension_op_with_a_non_dict_value_is_refused(stash_node: Any, op: int) -> None:
    mtype, body = await _stash(op, "ext", key="k", value=5)
    assert await _result(EXISTS, "ext", key="k") is False  # nothing was written
    assert mtype == ERROR and body["error"]["error_type"] == "StashError", body


@pytest.mark.parametrize("key", [math.nan, ["a", math.nan]], ids=["nan", "list-with-nan"])
async def test_a_nan_key_is_readable_back_or_refused(stash_node: Any, key: Any) -> None:
    for i in range(3):
        mtype, body = await _stash(PUT, "nan", key=key, value=i)
        if mtype == ERROR:  # refused: fine, if typed and nothing stored
            assert body["error"]["error_type"] == "StashError"
            assert await _result(KEYS, "nan") == []
            return
    assert await _result(INFO, "nan") == {"size": 1, "table": "nan"}
    assert await _result(GET, "nan", key=key) == 2


@pytest.mark.parametrize(
    ("op", "key", "value"),
    [(PUT, math.nan, 1), (INCR, "k", 5), (PUT_TTL, ["a", math.nan], {"value": 1})],
    ids=["nan-key", "non-dict-args", "nan-in-list-key"],
)
async def test_a_refused_first_write_creates_no_table(
    stash_node: Any, op: int, key: Any, value: Any
) -> None:
    mtype, body = await _stash(op, "never", key=key, value=value)
    assert mtype == ERROR and body["error"]["error_type"] == "StashError", body
    assert await _result(EXISTS, "never") is False


@pytest.mark.parametrize("op", [GET, DELETE, EXISTS])
async def test_a_bad_key_is_refused_on_a_missing_table_too(stash_node: Any, op: int) -> None:
    mtype, body = await _stash(op, "missing", key=["a", math.nan])
    assert mtype == ERROR and body["error"]["error_type"] == "StashError", body


async def test_tables_and_entries_survive_a_stash_manager_crash(stash_node: Any) -> None:
    """rest_for_one puts the table owners' supervisor before the manager: a crashed manager
    is restarted without touching a table; the declared stash is still there once."""
    assert await _result(PUT, "keep", key="k", value={"v": [1, 2]}) is True
    manager = otp.whereis(stash_server.MANAGER)
    assert manager is not None
    otp.exit(manager, "kill")
    with trio.fail_after(5):
        while otp.whereis(stash_server.MANAGER) in (None, manager):
            await trio.sleep(0.01)
    assert await _result(GET, "keep", key="k") == {"v": [1, 2]}
    assert await _result(TABLES, "") == ["declared", "keep"]
    assert await _result(PUT, "after", key="x", value=1) is True  # ensure works again


async def test_a_killed_table_owner_drops_only_its_table_and_it_can_be_recreated(
    stash_node: Any,
) -> None:
    for table in ("a", "b"):
        assert await _result(PUT, table, key="k", value=table) is True
    info = ets.info(stash_server._ets_name("a"))
    assert info is not None
    otp.exit(info.owner, "kill")
    with trio.fail_after(5):
        while ets.whereis(stash_server._ets_name("a")) is not None:
            await trio.sleep(0.01)
    assert await _result(EXISTS, "a") is False
    mtype, body = await _stash(GET, "a", key="k")
    assert mtype == ERROR and body["error"]["error_type"] == "StashKeyNotFoundError"
    assert await _result(GET, "b", key="k") == "b"
    assert await _result(PUT, "a", key="k", value=2) is True
    assert await _result(GET, "a", key="k") == 2


async def test_concurrent_first_writes_to_a_new_table_all_land(
    stash_node: Any, autojump_clock: trio.testing.MockClock
) -> None:
    """Twenty connections writing to a table that does not exist yet: one table is created
    (the manager serialises ensure), and no write is lost."""
    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(functools.partial(_result, PUT, "fresh", key=i, value=i))
        nursery.start_soon(functools.partial(_result, INCR, "fresh", key="n", value={"incr": 1}))
        nursery.start_soon(
            functools.partial(_result, INSERT_NEW, "fresh", key="once", value={"value": 1})
        )
    assert await _result(INFO, "fresh") == {"size": 22, "table": "fresh"}
    assert sorted(await _result(KEYS, "fresh", pattern="[0-9]*"), key=int) == list(range(20))
    assert [t for t in await _result(TABLES, "") if t == "fresh"] == ["fresh"]
