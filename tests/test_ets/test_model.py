"""Model-based test: random operations on a real table and on a pure model of each table type.

Hypothesis's state machines are synchronous, so each machine keeps one node running in a
``trio.run`` on a helper thread (a "portal") and its rules run operations there, inside agent
processes: the table's owner, another process, and sometimes an heir. After every step the
table's contents must equal the model's. Owner death (with and without a live heir) and access
violations from the other process are rules too.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import attrs
import trio
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import otp
from otp import ets
from otp.ets import ANY, OBJECT, Var

# -- the portal: one node on a helper thread -----------------------------------------------------


@attrs.define
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    done: trio.Event = attrs.field(factory=trio.Event)
    outcome: tuple[bool, Any] = (False, None)


async def _agent() -> None:
    """A process that runs jobs sent to it, so operations run as that process."""
    while True:
        job = await otp.receive(match=_Job)
        try:
            result = job.fn(*job.args)
            if hasattr(result, "__await__"):
                result = await result
            job.outcome = (True, result)
        except Exception as exc:
            job.outcome = (False, exc)
        job.done.set()


class Portal:
    """A node running in ``trio.run`` on its own thread; ``call`` runs a coroutine there."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._thread.start()
        self._ready.wait()

    async def _main(self) -> None:
        async with otp.open_node():
            self._token = trio.lowlevel.current_trio_token()
            self._stop = trio.Event()
            self._ready.set()
            await self._stop.wait()

    def call(self, afn: Callable[..., Any], *args: Any) -> Any:
        return trio.from_thread.run(afn, *args, trio_token=self._token)

    def spawn_agent(self) -> otp.Pid:
        async def spawn() -> otp.Pid:
            return otp.spawn(_agent)

        return self.call(spawn)

    def run_as(self, pid: otp.Pid, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        """Run ``fn(*args)`` in the process ``pid``; returns (ok, result or exception)."""

        async def run() -> tuple[bool, Any]:
            job = _Job(fn, args)
            otp.send(pid, job)
            await job.done.wait()
            return job.outcome

        return self.call(run)

    def kill(self, pid: otp.Pid) -> None:
        async def kill() -> None:
            otp.exit(pid, "kill")
            while otp.process_info(pid) is not None:
                await trio.lowlevel.checkpoint()

        self.call(kill)

    def close(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()


# -- the model ------------------------------------------------------------------------------------


def model_order(key: Any) -> tuple[Any, ...]:
    """The documented term order, restricted to the terms generated here: None < numbers (by
    value: 1, 1.0 and True are one key) < str < tuple (size first) < bytes."""
    if key is None:
        return (-1,)
    if isinstance(key, int | float):
        return (0, key)
    if isinstance(key, str):
        return (1, key)
    if isinstance(key, bytes):
        return (3, key)
    return (2, len(key), tuple(model_order(item) for item in key))


def exactly(a: Any, b: Any) -> bool:
    """Erlang's =:= on the terms generated here: 1, 1.0 and True all differ."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(map(exactly, a, b))
    return type(a) is type(b) and a == b


def model_above(value: Any, threshold: int) -> bool:
    """``value > threshold`` in the term order (a str is above every number)."""
    return isinstance(value, str) or value > threshold


def model_below(value: Any, threshold: int) -> bool:
    return not isinstance(value, str) and value < threshold


@attrs.define
class Model:
    kind: ets.TableType
    access: ets.Access
    data: dict[Any, list[tuple[Any, ...]]] = attrs.field(factory=dict)

    @property
    def unique(self) -> bool:
        return self.kind in (ets.SET, ets.ORDERED_SET)

    def keys(self) -> list[Any]:
        keys = list(self.data)
        return sorted(keys, key=model_order) if self.kind is ets.ORDERED_SET else keys

    def objects(self) -> list[tuple[Any, ...]]:
        return [obj for key in self.keys() for obj in self.data[key]]

    def insert(self, objs: list[tuple[Any, ...]]) -> None:
        for obj in objs:
            key = obj[0]
            stored = self.data.get(key)
            if stored is None or self.unique:
                self.data[key] = [obj]
            elif self.kind is ets.DUPLICATE_BAG or not any(exactly(obj, o) for o in stored):
                stored.append(obj)

    def delete_object(self, obj: tuple[Any, ...]) -> None:
        stored = self.data.get(obj[0], [])
        kept = [other for other in stored if not exactly(other, obj)]
        if kept:
            self.data[obj[0]] = kept
        else:
            self.data.pop(obj[0], None)


# -- strategies -----------------------------------------------------------------------------------

# Keys of mixed types, ints, floats and bools that are one key (1, 1.0, True; (1, "a") and
# (1.0, "a")), and tuples of different sizes (size sorts first).
keys = st.one_of(
    st.integers(0, 4),
    st.sampled_from(
        [1.0, 2.5, -1.5, True, None, "a", "b", b"k", (0, "a"), (1, "a"), (1.0, "a"), (1,), (9,)]
    ),
    st.sampled_from([(), ((1,), 2.0), (3, 0.5, b"\x00")]),
)
# Values that are equal but not exact (2 and 2.0), and a str above every number.
values = st.one_of(st.integers(-3, 3), st.sampled_from([2.0, 0.5, "s"]))
objects = st.tuples(keys, values, st.sampled_from(["x", "y"]))
who = st.sampled_from(["owner", "other"])
table_types = st.sampled_from(list(ets.TableType))
accesses = st.sampled_from(list(ets.Access))


def _same(actual: list[Any], expected: list[Any], ordered: bool) -> bool:
    """Equal lists (ordered) or equal multisets, by exact match (``1`` is not ``1.0``)."""
    if ordered:
        return len(actual) == len(expected) and all(map(exactly, actual, expected))
    remaining = list(expected)
    for item in actual:
        for index, candidate in enumerate(remaining):
            if exactly(candidate, item):
                del remaining[index]
                break
        else:
            return False
    return not remaining


class EtsMachine(RuleBasedStateMachine):
    """Random operations on one table at a time, compared with :class:`Model`."""

    def __init__(self) -> None:
        super().__init__()
        self.portal = Portal()
        self.other = self.portal.spawn_agent()
        self.model: Model | None = None
        self.table: Any = None
        self.owner: otp.Pid | None = None
        self.heir: otp.Pid | None = None

    def teardown(self) -> None:
        self.portal.close()

    # -- helpers ---------------------------------------------------------------------------

    def _pid(self, actor: str) -> otp.Pid:
        assert self.owner is not None
        return self.owner if actor == "owner" else self.other

    def _denied(self, actor: str, writes: bool) -> bool:
        assert self.model is not None
        if actor == "owner" or self.model.access is ets.PUBLIC:
            return False
        return writes or self.model.access is ets.PRIVATE

    def _do(self, actor: str, writes: bool, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        """Run an operation; if the model says it must be refused, check that it was (and
        return (False, None)); else check it succeeded and return (True, result)."""
        ok, result = self.portal.run_as(self._pid(actor), fn, self.table, *args)
        if self.model is None:
            assert not ok and isinstance(result, ets.NoSuchTable), result
            return False, None
        if self._denied(actor, writes):
            assert not ok and isinstance(result, ets.AccessDenied), result
            assert fn.__module__ != "otp.ets" or result.operation == fn.__name__
            return False, None
        if not ok:
            raise result
        return True, result

    # -- lifecycle rules ---------------------------------------------------------------------

    @initialize(kind=table_types, access=accesses, named=st.booleans(), with_heir=st.booleans())
    def first_table(self, kind, access, named, with_heir):
        self.new_table(kind, access, named, with_heir)

    @precondition(lambda self: self.model is None)
    @rule(kind=table_types, access=accesses, named=st.booleans(), with_heir=st.booleans())
    def new_table(self, kind, access, named, with_heir):
        self.owner = self.portal.spawn_agent()
        self.heir = self.portal.spawn_agent() if with_heir else None
        ok, table = self.portal.run_as(
            self.owner,
            lambda: ets.new(
                "model", type=kind, access=access, named=named, heir=self.heir, heir_data="data"
            ),
        )
        assert ok, table
        self.table = table
        self.model = Model(kind, access)

    @precondition(lambda self: self.model is not None)
    @rule()
    def kill_owner(self):
        old = self.owner
        assert old is not None
        self.portal.kill(old)
        if self.heir is not None and self.heir != old:
            # The heir owns the table now and was told so.
            ok, transfer = self.portal.run_as(self.heir, _take_transfer)
            assert ok and transfer == ets.EtsTransfer(self.table, old, "data"), transfer
            self.owner = self.heir
            info = self.portal.run_as(self.other, ets.info, self.table)[1]
            assert info.owner == self.heir
        else:
            self.model = None
            assert self.portal.run_as(self.other, ets.info, self.table) == (True, None)
            self.owner = self.portal.spawn_agent()  # a stand-in: the table is gone for all

    @precondition(lambda self: self.model is not None and self.heir not in (None, self.owner))
    @rule()
    def kill_heir(self):
        assert self.heir is not None
        self.portal.kill(self.heir)
        self.heir = None

    @precondition(lambda self: self.model is not None)
    @rule(actor=who)
    def delete_table(self, actor):
        done, _ = self._do(actor, True, ets.delete)
        if done:
            self.model = None

    # -- object rules ------------------------------------------------------------------------

    @rule(actor=who, objs=st.lists(objects, min_size=1, max_size=4), as_list=st.booleans())
    def insert(self, actor, objs, as_list):
        payload = objs if as_list or len(objs) > 1 else objs[0]
        done, _ = self._do(actor, True, ets.insert, payload)
        if done:
            self.model.insert(objs)

    @rule(actor=who, objs=st.lists(objects, min_size=1, max_size=3))
    def insert_new(self, actor, objs):
        done, result = self._do(actor, True, ets.insert_new, objs)
        if done:
            expected = not any(obj[0] in self.model.data for obj in objs)
            assert result is expected
            if expected:
                self.model.insert(objs)

    @rule(actor=who, key=keys)
    def lookup(self, actor, key):
        done, result = self._do(actor, False, ets.lookup, key)
        if done:
            assert result == self.model.data.get(key, [])

    @rule(actor=who, key=keys)
    def member(self, actor, key):
        done, result = self._do(actor, False, ets.member, key)
        if done:
            assert result is (key in self.model.data)

    @rule(actor=who, key=keys)
    def delete_key(self, actor, key):
        done, _ = self._do(actor, True, ets.delete, key)
        if done:
            self.model.data.pop(key, None)

    @rule(actor=who, obj=objects)
    def delete_object(self, actor, obj):
        done, _ = self._do(actor, True, ets.delete_object, obj)
        if done:
            self.model.delete_object(obj)

    @rule(actor=who, key=keys)
    def take(self, actor, key):
        done, result = self._do(actor, True, ets.take, key)
        if done:
            assert result == self.model.data.pop(key, [])

    @precondition(lambda self: self.model is not None and self.model.unique)
    @rule(actor=who, key=keys, incr=st.integers(-2, 2), with_default=st.booleans())
    def update_counter(self, actor, key, incr, with_default):
        default = (None, 10, "d") if with_default else None
        ok, result = self.portal.run_as(
            self._pid(actor), ets.update_counter, self.table, key, incr, default
        )
        if self._denied(actor, True):
            assert not ok and isinstance(result, ets.AccessDenied)
            return
        stored = self.model.data.get(key)
        if stored is None and default is None:
            assert not ok and isinstance(result, ets.KeyNotFound), result
            return
        if stored is not None and stored[0][1].__class__ is not int:
            assert not ok and isinstance(result, ets.EtsError), result  # 2.0 is no counter
            return
        assert ok, result
        base = stored[0] if stored else (key, 10, "d")
        updated = (base[0], base[1] + incr, base[2])
        assert result == updated[1]
        self.model.data[key] = [updated]

    @rule(actor=who)
    def delete_all_objects(self, actor):
        done, _ = self._do(actor, True, ets.delete_all_objects)
        if done:
            self.model.data.clear()

    @rule(actor=who, threshold=st.integers(-3, 3))
    def select(self, actor, threshold):
        spec = [((ANY, Var(1), ANY), [(">", Var(1), threshold)], OBJECT)]
        done, result = self._do(actor, False, ets.select, spec)
        if done:
            expected = [obj for obj in self.model.objects() if model_above(obj[1], threshold)]
            assert _same(result, expected, self.model.kind is ets.ORDERED_SET)

    @rule(actor=who, value=st.sampled_from(["x", "y"]))
    def match(self, actor, value):
        done, result = self._do(actor, False, ets.match, (Var(1), Var(2), value))
        if done:
            expected = [[obj[0], obj[1]] for obj in self.model.objects() if obj[2] == value]
            assert _same(result, expected, self.model.kind is ets.ORDERED_SET)

    @rule(actor=who, threshold=st.integers(-3, 3))
    def select_delete(self, actor, threshold):
        spec = [((ANY, Var(1), ANY), [("<", Var(1), threshold)], True)]
        done, result = self._do(actor, True, ets.select_delete, spec)
        if done:
            doomed = [obj for obj in self.model.objects() if model_below(obj[1], threshold)]
            assert result == len(doomed)
            for key in list(self.model.data):
                kept = [obj for obj in self.model.data[key] if not model_below(obj[1], threshold)]
                if kept:
                    self.model.data[key] = kept
                else:
                    del self.model.data[key]

    @rule(
        actor=who,
        threshold=st.integers(-3, 3),
        limit=st.integers(1, 4),
        reverse=st.booleans(),
    )
    def select_in_chunks(self, actor, threshold, limit, reverse):
        spec = [((ANY, Var(1), ANY), [(">", Var(1), threshold)], OBJECT)]
        done, chunks = self._do(actor, False, _chunks, spec, limit, reverse)
        if done:
            assert all(len(chunk) == limit for chunk in chunks[:-1])
            assert all(0 < len(chunk) <= limit for chunk in chunks)
            expected = [obj for obj in self.model.objects() if model_above(obj[1], threshold)]
            if reverse and self.model.kind is ets.ORDERED_SET:
                expected.reverse()
            results = [obj for chunk in chunks for obj in chunk]
            assert _same(results, expected, self.model.kind is ets.ORDERED_SET)

    @precondition(lambda self: self.model is not None)
    @rule(obj=objects, delete=st.booleans(), limit=st.integers(1, 3))
    def continuation_across_a_write(self, obj, delete, limit):
        """The owner starts a chunked select, writes, then finishes it: every object present
        before and after is returned once, and nothing that never was."""
        before = Counter(self.model.objects())
        ok, results = self.portal.run_as(
            self.owner, _chunked_across, self.table, obj, delete, limit
        )
        assert ok, results
        if delete:
            self.model.data.pop(obj[0], None)
        else:
            self.model.insert([obj])
        after = Counter(self.model.objects())
        returned = Counter(results)
        assert before & after <= returned
        assert returned <= before | after
        if self.model.unique:
            assert len({o[0] for o in results}) == len(results)

    @rule(actor=who, value=st.sampled_from(["x", "y"]))
    def select_replace(self, actor, value):
        spec = [((Var(1), Var(2), value), [], (Var(1), Var(2), "z"))]
        ok, result = self.portal.run_as(self._pid(actor), ets.select_replace, self.table, spec)
        if self.model is None:
            assert not ok and isinstance(result, ets.NoSuchTable), result
            return
        if self._denied(actor, True):
            assert not ok and isinstance(result, ets.AccessDenied), result
            return
        if self.model.kind is ets.BAG:
            assert not ok and isinstance(result, ets.EtsError), result
            return
        assert ok, result
        replaced = 0
        for stored in self.model.data.values():
            for index, old in enumerate(stored):
                if old[2] == value:
                    stored[index] = (old[0], old[1], "z")
                    replaced += 1
        assert result == replaced

    @rule(actor=who, right=st.booleans())
    def fold(self, actor, right):
        fold = ets.foldr if right else ets.foldl
        done, result = self._do(actor, False, _fold, fold)
        if done:
            expected = self.model.objects()
            if right and self.model.kind is ets.ORDERED_SET:
                expected.reverse()
            assert _same(result, expected, self.model.kind is ets.ORDERED_SET)

    @rule(actor=who)
    def slots(self, actor):
        done, result = self._do(actor, False, _slots)
        if done:
            assert _same(result, self.model.objects(), self.model.kind is ets.ORDERED_SET)

    @rule(actor=who)
    def traverse(self, actor):
        done, result = self._do(actor, False, _walk)
        if done:
            expected = self.model.keys()
            if self.model.kind is ets.ORDERED_SET:
                assert result == expected
            else:
                assert len(result) == len(expected) and set(result) == set(expected)

    # -- the invariant -------------------------------------------------------------------------

    @invariant()
    def contents_match_the_model(self):
        if self.model is None or self.owner is None:
            return
        ok, result = self.portal.run_as(self.owner, ets.tab2list, self.table)
        assert ok, result
        assert _same(result, self.model.objects(), self.model.kind is ets.ORDERED_SET)
        ok, info = self.portal.run_as(self.other, ets.info, self.table)
        assert ok and info.size == sum(len(objs) for objs in self.model.data.values())
        assert info.owner == self.owner


def _walk(table: Any) -> list[Any]:
    found, key = [], ets.first(table)
    while key is not ets.END_OF_TABLE:
        found.append(key)
        key = ets.next(table, key)
    return found


def _chunks(table: Any, spec: Any, limit: int, reverse: bool) -> list[list[Any]]:
    select = ets.select_reverse if reverse else ets.select
    chunks, answer = [], select(table, spec, limit)
    while answer is not ets.END_OF_TABLE:
        chunk, cont = answer
        chunks.append(chunk)
        answer = select(cont)
    return chunks


def _chunked_across(table: Any, obj: tuple[Any, ...], delete: bool, limit: int) -> list[Any]:
    answer = ets.select(table, [(ANY, [], OBJECT)], limit)
    results: list[Any] = []
    if answer is not ets.END_OF_TABLE:
        results.extend(answer[0])
    if delete:
        ets.delete(table, obj[0])
    else:
        ets.insert(table, obj)
    while answer is not ets.END_OF_TABLE and answer[1] is not ets.END_OF_TABLE:
        answer = ets.select(answer[1])
        if answer is not ets.END_OF_TABLE:
            results.extend(answer[0])
    return results


def _fold(table: Any, fold: Any) -> list[Any]:
    return fold(lambda obj, acc: [*acc, obj], [], table)


def _slots(table: Any) -> list[Any]:
    found, i = [], 0
    while (objects := ets.slot(table, i)) is not ets.END_OF_TABLE:
        found.extend(objects)
        i += 1
    return found


async def _take_transfer() -> Any:
    return await otp.receive(match=ets.EtsTransfer, timeout=0, default=None)


EtsMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEtsAgainstModel = EtsMachine.TestCase
