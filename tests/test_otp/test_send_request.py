"""otp.send_request: a GenServer call answered by a Response message (OTP's send_request)."""

from __future__ import annotations

from typing import Any

import pytest

import otp


class Echo(otp.GenServer):
    async def init(self) -> otp.Ok:
        return otp.Ok(None)

    def handle_call(self, request: Any, from_: otp.From, state: Any) -> Any:
        if request == "crash":
            raise RuntimeError("asked to crash")
        if request == "later":
            return otp.NoReply(from_)  # answered by the next call
        if request == "answer_later":
            otp.reply(state, "late answer")
            return otp.Reply("done", None)
        return otp.Reply(("echo", request), state)


async def test_the_reply_arrives_as_a_response_naming_the_request() -> None:
    async with otp.open_node():
        server = await Echo.start_link()
        first = otp.send_request(server, 1)
        second = otp.send_request(server, 2)
        got = [await otp.receive(), await otp.receive()]
        assert got == [
            otp.Response(first, ("echo", 1), None),
            otp.Response(second, ("echo", 2), None),
        ]


async def test_a_server_that_dies_answers_with_its_exit_reason() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        server = await Echo.start_link()
        ref = otp.send_request(server, "crash")
        response = await otp.receive(otp.Response)
        exit_signal = await otp.receive(otp.Exit)
        assert response.request_id == ref
        assert isinstance(response.error, otp.Crash)
        assert response.value is None
        assert isinstance(exit_signal.reason, otp.Crash)


async def test_a_server_that_is_not_alive_answers_noproc_at_once() -> None:
    async with otp.open_node():
        ref = otp.send_request("nobody_registered_this", "hello")
        response = await otp.receive(timeout=0, default=None)
        assert response == otp.Response(ref, None, "noproc")


async def test_a_request_to_itself_answers_calling_self() -> None:
    async with otp.open_node():
        ref = otp.send_request(otp.self(), "hello")
        response = await otp.receive(timeout=0, default=None)
        assert response == otp.Response(ref, None, "calling_self")


async def test_exactly_one_response_per_request_even_if_the_server_dies_after_replying() -> None:
    async with otp.open_node():
        server = await Echo.start()
        ref = otp.send_request(server, "x")
        first = await otp.receive()
        watch = otp.monitor(server)
        otp.exit(server, otp.KILL)
        down = await otp.receive(otp.Down)
        assert down.ref == watch
        rest = []
        while (extra := await otp.receive(timeout=0, default=None)) is not None:
            rest.append(extra)
        assert first == otp.Response(ref, ("echo", "x"), None)
        assert rest == []


async def test_a_reply_given_later_from_another_callback_still_arrives() -> None:
    async with otp.open_node():
        server = await Echo.start_link()
        ref = otp.send_request(server, "later")
        assert await otp.receive(timeout=0, default=None) is None
        await otp.call(server, "answer_later")
        response = await otp.receive()
        assert response == otp.Response(ref, "late answer", None)


def test_a_server_of_the_wrong_type_is_a_type_error() -> None:
    async def main() -> None:
        with pytest.raises(TypeError):
            otp.send_request(3.5, "x")

    otp.run(main)
