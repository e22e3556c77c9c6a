"""Values of registered attrs classes across nodes (``otp.remote_value``): they arrive equal,
nested in messages and in each other; an unregistered one is refused at send time with what to
do; a name the receiver does not know is dropped on receipt, logged, and the connection lives."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import otp
import wire

from ..peer import PeerNode
from .helpers import B, _b_with_x, _frame, _marker, _up


@otp.remote_value
@attrs.frozen
class Point:
    x: int
    y: int = 0


@otp.remote_value(name="tests.Shape")
@attrs.frozen
class Shape:
    name: str
    corners: tuple[Point, ...]
    owner: otp.Pid | None = None
    tags: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class Unregistered:
    x: int


@otp.remote_value(name="tests.Positive")
@attrs.frozen
class Positive:
    n: int = attrs.field()

    @n.validator
    def _positive(self, attribute: Any, value: int) -> None:
        if value <= 0:
            raise ValueError(f"n must be > 0 (got {value})")


async def test_a_registered_value_arrives_equal_with_its_nested_values(sockets: Any) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _up(sockets)
        shape = Shape("square", (Point(0), Point(1, 1)), otp.self(), {"p": [Point(2, 3)]})
        with trio.fail_after(4):
            back = await otp.call(("echo", B), ("shape", shape, [Point(5)]))
        assert back == ("shape", shape, [Point(5)])
        assert type(back[1].corners[1]) is Point
        assert back[1].owner == otp.self()


async def test_an_unregistered_value_is_refused_at_send_time_saying_how_to_register_it(
    sockets: Any,
) -> None:
    async with PeerNode(B, sockets("b")), otp.open_node("a@localhost"):
        await _up(sockets)
        with pytest.raises(otp.BadArg) as info:
            otp.send(("echo", B), ("x", [Unregistered(1)]))
        assert "Unregistered" in str(info.value)
        assert "otp.remote_value(Unregistered)" in str(info.value)
        assert await otp.call(("echo", B), "still up") == "still up"


def test_only_attrs_frozen_classes_register_under_one_name_each() -> None:
    @attrs.define
    class Mutable:
        x: int

    with pytest.raises(otp.BadArg, match="attrs frozen"):
        otp.remote_value(Mutable)
    with pytest.raises(otp.BadArg, match="attrs frozen"):
        otp.remote_value(dict)

    @attrs.frozen
    class Other:
        x: int

    with pytest.raises(otp.BadArg, match="registered for"):
        otp.remote_value(Other, name="tests.Shape")
    with pytest.raises(otp.BadArg, match=r"registered as 'tests\.Shape' already"):
        otp.remote_value(Shape, name="tests.Elsewhere")
    assert otp.remote_value(Shape, name="tests.Shape") is Shape  # again: nothing changes


def _record(name: str, fields: Any) -> Any:
    return (wire.Atom("$record"), name, fields)


@pytest.mark.parametrize(
    ("value", "logged"),
    [
        (_record("nowhere.Unknown", {}), "no class is registered under that name"),
        (_record("tests.Positive", {"n": -1}), "n must be > 0"),
        (_record("tests.Positive", {"n": 1, "m": 2}), "field 'm' is not one of Positive's"),
        (_record("tests.Positive", [1]), "its fields are a list"),
    ],
)
async def test_a_value_the_receiver_cannot_rebuild_is_dropped_and_the_connection_lives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, value: Any, logged: str
) -> None:
    caplog.set_level(logging.WARNING, logger="otp.distribution")
    async with _b_with_x(tmp_path) as stream:
        me = wire.Pid("b@localhost", otp.self().id, otp.self().creation)
        good = _record("tests.Positive", {"n": 2})
        await stream.send_all(
            # one bad message in a batch: the others of the batch still arrive
            _frame(wire.MessageType.SEND_BATCH, {"to": me, "msgs": ["before", value, good]})
            + _frame(wire.MessageType.REG_SEND, {**_marker(), "msg": ("wrapped", value)})
            + _frame(wire.MessageType.REG_SEND, _marker())
        )
        with trio.fail_after(5):
            assert await otp.receive() == "before"
            assert await otp.receive() == Positive(2)
            assert await otp.receive() == "done"
        assert "x@localhost" in otp.nodes()
    drops = [r.getMessage() for r in caplog.records if "was dropped" in r.getMessage()]
    assert len(drops) == 2 and all(logged in d for d in drops), drops


async def test_an_exit_reason_holding_an_unknown_value_still_fires_the_link(
    tmp_path: Path,
) -> None:
    async with _b_with_x(tmp_path) as stream:
        otp.process_flag(trap_exit=True)
        me = wire.Pid("b@localhost", otp.self().id, otp.self().creation)
        peer = wire.Pid("x@localhost", 3, 1)
        reason = wire.ExitReason("shutdown", _record("nowhere.Gone", {}))
        await stream.send_all(
            _frame(wire.MessageType.LINK, {"from": peer, "to": me})
            + _frame(wire.MessageType.EXIT, {"from": peer, "to": me, "reason": reason})
        )
        with trio.fail_after(5):
            exit_ = await otp.receive(otp.Exit)
        assert isinstance(exit_.reason, otp.Shutdown)
        assert "nowhere.Gone" in exit_.reason.detail
