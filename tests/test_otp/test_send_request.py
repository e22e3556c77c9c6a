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


async def test_on_response_gets_the_reply_in_the_servers_task_instead_of_a_message() -> None:
    async with otp.open_node():
        server = await Echo.start_link()
        seen: list[tuple[otp.Response, otp.Pid]] = []
        ref = otp.send_request(server, 1, on_response=lambda r: seen.append((r, otp.self())))
        assert seen == []  # (never before send_request returned)
        await otp.call(server, "sync")  # (the request was served before this call)
        assert seen == [(otp.Response(ref, ("echo", 1), None), server)]
        assert await otp.receive(timeout=0, default=None) is None


async def test_a_request_handed_over_is_not_sent_and_its_later_reply_goes_to_on_response() -> None:
    async with otp.open_node():
        server = await Echo.start_link()
        seen: list[otp.Response] = []
        handed: list[tuple[otp.From, Any]] = []

        def hand_over(from_: otp.From, request: Any) -> bool:
            handed.append((from_, request))
            return request == "take it"

        ref = otp.send_request(server, "take it", on_response=seen.append, hand_over=hand_over)
        [(from_, request)] = handed
        assert request == "take it" and from_.pid == otp.self()
        assert otp.message_queue_len(server) == 0  # (not sent)
        assert seen == []
        otp.reply(from_, "taken")
        assert seen == [otp.Response(ref, "taken", None)]
        sent = otp.send_request(server, 2, on_response=seen.append, hand_over=hand_over)
        await otp.call(server, "sync")  # (refused: sent, and served before this call)
        assert seen[-1] == otp.Response(sent, ("echo", 2), None)
        assert await otp.receive(timeout=0, default=None) is None


async def test_a_request_answered_inside_hand_over_goes_to_on_response_there() -> None:
    async with otp.open_node():
        server = await Echo.start_link()
        seen: list[tuple[otp.Response, bool]] = []
        inside = [False]

        def hand_over(from_: otp.From, request: Any) -> bool:
            inside[0] = True
            otp.reply(from_, "at once")
            inside[0] = False
            return True

        ref = otp.send_request(
            server, 1, on_response=lambda r: seen.append((r, inside[0])), hand_over=hand_over
        )
        assert seen == [(otp.Response(ref, "at once", None), True)]
        assert await otp.receive(timeout=0, default=None) is None


async def test_a_request_answered_inside_hand_over_without_on_response_comes_as_a_message() -> None:
    async with otp.open_node():
        server = await Echo.start_link()

        def hand_over(from_: otp.From, request: Any) -> bool:
            otp.reply(from_, "at once")
            return True

        ref = otp.send_request(server, 1, hand_over=hand_over)
        assert await otp.receive(timeout=0, default=None) == otp.Response(ref, "at once", None)


async def test_on_response_gets_the_exit_reason_of_a_server_that_dies() -> None:
    async with otp.open_node():
        otp.process_flag(trap_exit=True)
        server = await Echo.start_link()
        seen: list[otp.Response] = []
        ref = otp.send_request(server, "crash", on_response=seen.append)
        exit_signal = await otp.receive(otp.Exit)
        assert isinstance(exit_signal.reason, otp.Crash)
        [response] = seen
        assert response.request_id == ref
        assert response.value is None
        assert isinstance(response.error, otp.Crash)
        assert await otp.receive(timeout=0, default=None) is None


async def test_a_request_answered_at_once_comes_as_a_message_even_with_on_response() -> None:
    async with otp.open_node():
        seen: list[otp.Response] = []
        ref = otp.send_request("nobody_registered_this", "hello", on_response=seen.append)
        assert await otp.receive(timeout=0, default=None) == otp.Response(ref, None, "noproc")
        assert seen == []


async def test_an_on_response_that_raises_crashes_the_caller_not_the_server() -> None:
    async with otp.open_node():
        server = await Echo.start()

        async def caller() -> None:
            def broken(response: otp.Response) -> None:
                raise RuntimeError("cannot take it")

            otp.send_request(server, 1, on_response=broken)
            await otp.receive()  # (ended by its crash while it waits)

        pid = otp.spawn(caller)
        ref = otp.monitor(pid)
        down = await otp.receive(otp.Down)
        assert down.ref == ref
        assert isinstance(down.reason, otp.Crash)
        assert str(down.reason.exception) == "cannot take it"
        assert otp.is_process_alive(server)
        assert await otp.call(server, 2) == ("echo", 2)


async def test_on_response_is_not_called_once_the_caller_is_dead() -> None:
    async with otp.open_node():
        server = await Echo.start()
        seen: list[otp.Response] = []

        async def caller() -> None:
            otp.send_request(server, "later", on_response=seen.append)

        ref = otp.monitor(otp.spawn(caller))
        assert (await otp.receive(otp.Down)).ref == ref
        assert await otp.call(server, "answer_later") == "done"
        assert seen == []
