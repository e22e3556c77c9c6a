"""Bearer credentials over TCP with TLS, as the SDKs meet them (seed, Server 和网络配置): a real
server on ``tcp://127.0.0.1:0`` with a trustme certificate and worker and client tokens. A wrong
or missing token is an :class:`AuthenticationError` saying what to pass, the server logs the
refusal and serves everyone else on."""

from __future__ import annotations

import asyncio
import os
import ssl
import threading

import pytest
import trio
import trustme

from apps.matching import (
    AsyncClient,
    AuthenticationError,
    Client,
    ClientOptions,
    Flow,
    Registry,
    TrioClient,
    TrioWorker,
    WorkerOptions,
    step,
)

from ._in_process import BOUND, matching_server


class Hello(Flow):
    name = "Hello"

    @step
    async def greet(self, ctx, who):
        return f"Hello, {who}!"


REGISTRY = Registry([Hello], allow_async_handlers=True)


@pytest.fixture
def tls(tmp_path) -> tuple[dict[str, str], ssl.SSLContext]:
    """The server's TLS settings and a client context trusting them."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    certfile, keyfile = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    cert.private_key_and_cert_chain_pem.write_to_path(certfile)
    cert.private_key_pem.write_to_path(keyfile)
    os.chmod(keyfile, 0o600)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return {"tls_certfile": certfile, "tls_keyfile": keyfile}, context


def _server(tls, store_kind):
    files, _ = tls
    return matching_server(
        store_kind,
        listen=["tcp://127.0.0.1:0"],
        worker_tokens=["w-secret"],
        client_tokens=["c-secret"],
        **files,
    )


async def test_a_worker_with_a_wrong_token_fails_start_and_its_waiters(store_kind, tls, caplog):
    _, context = tls
    async with _server(tls, store_kind) as address:
        for token in ("wrong", "c-secret"):  # a client's token is no worker's
            options = WorkerOptions(server_address=address, credentials=token, ssl_context=context)
            worker = TrioWorker(REGISTRY, None, options)
            async with trio.open_nursery() as nursery:
                with trio.fail_after(BOUND):

                    async def run(worker=worker) -> None:
                        with pytest.raises(AuthenticationError, match="worker token is wrong"):
                            await worker.start()

                    nursery.start_soon(run)
                    with pytest.raises(AuthenticationError) as caught:
                        await worker.wait_pull_registered()
            assert "pass the worker credentials the server is configured with" in str(caught.value)
            assert not worker.pull_registration_state().is_ready
    assert "refused a worker connection from 127.0.0.1" in caplog.text


def _worker(address: str, context: ssl.SSLContext) -> TrioWorker:
    """A worker with the right token, trusting the server's certificate."""
    options = WorkerOptions(server_address=address, credentials="w-secret", ssl_context=context)
    return TrioWorker(REGISTRY, None, options)


@pytest.mark.parametrize(
    ("token", "word"), [("wrong", "wrong"), ("w-secret", "wrong"), (None, "missing")]
)
async def test_a_client_with_a_wrong_or_missing_token_gets_authentication_error(
    store_kind, tls, token, word, monkeypatch
):
    monkeypatch.delenv("OTP_MATCHING_TOKEN", raising=False)
    _, context = tls
    async with _server(tls, store_kind) as address:
        options = ClientOptions(server_address=address, credentials=token, ssl_context=context)
        async with TrioClient(REGISTRY, None, options) as client:
            with trio.fail_after(BOUND), pytest.raises(AuthenticationError) as caught:
                await client.list_flows()
    assert f"the client token is {word}" in str(caught.value)
    assert "pass the client credentials" in str(caught.value)


async def test_the_right_tokens_serve_a_flow_while_wrong_ones_are_refused(store_kind, tls):
    _, context = tls
    async with _server(tls, store_kind) as address, trio.open_nursery() as nursery:
        worker = _worker(address, context)
        nursery.start_soon(worker.start)
        good = ClientOptions(server_address=address, credentials="c-secret", ssl_context=context)
        bad = ClientOptions(server_address=address, credentials="nope", ssl_context=context)
        with trio.fail_after(BOUND):
            await worker.wait_pull_registered()
            async with TrioClient(REGISTRY, None, bad) as intruder:
                with pytest.raises(AuthenticationError):
                    await intruder.start_flow(Hello, "intruder")
            async with TrioClient(REGISTRY, None, good) as client:
                flow_id = await client.start_flow(Hello, "TLS")
                assert await client.result(flow_id) == "Hello, TLS!"
                assert [f.flow_id for f in await client.list_flows()] == [flow_id]
        await worker.close()


async def test_a_server_certificate_the_client_does_not_trust_is_refused(store_kind, tls):
    async with _server(tls, store_kind) as address:
        options = ClientOptions(server_address=address, credentials="c-secret")
        async with TrioClient(REGISTRY, None, options) as client:
            with trio.fail_after(BOUND), pytest.raises(AuthenticationError, match="verification"):
                await client.list_flows()


def _blocking_tls(good: ClientOptions, refused: list[tuple[ClientOptions, str]]) -> list[str]:
    for options, match in refused:
        with Client(REGISTRY, None, options) as client:
            with pytest.raises(AuthenticationError, match=match):
                client.list_flows()
    with Client(REGISTRY, None, good) as client:
        flow_ids = [client.start_flow(Hello, f"TLS {i}") for i in range(4)]
        results: list[str] = []

        def wait(flow_id: str) -> None:
            results.append(client.result(flow_id, timeout=BOUND))

        threads = [threading.Thread(target=wait, args=(f,)) for f in flow_ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sorted(results)


def _asyncio_tls(good: ClientOptions, refused: list[tuple[ClientOptions, str]]) -> list[str]:
    async def main() -> list[str]:
        for options, match in refused:
            async with AsyncClient(REGISTRY, None, options) as client:
                with pytest.raises(AuthenticationError, match=match):
                    await client.list_flows()
        async with AsyncClient(REGISTRY, None, good) as client:
            flow_ids = [await client.start_flow(Hello, f"TLS {i}") for i in range(4)]
            return sorted(
                await asyncio.gather(*(client.result(f, timeout=BOUND) for f in flow_ids))
            )

    return asyncio.run(main())


@pytest.mark.parametrize("flavour", [_blocking_tls, _asyncio_tls], ids=["blocking", "asyncio"])
async def test_the_blocking_and_asyncio_clients_speak_tls_with_their_tokens(
    store_kind, tls, flavour
):
    # Their own transports (no trio under them): the blocking one's TLS runs on memory BIOs
    # under its connection's lock, so threads reading and writing at once never share the
    # SSL object unguarded (the calls above wait from four threads at once).
    _, context = tls
    async with _server(tls, store_kind) as address, trio.open_nursery() as nursery:
        worker = _worker(address, context)
        nursery.start_soon(worker.start)
        good = ClientOptions(server_address=address, credentials="c-secret", ssl_context=context)
        refused = [
            (
                ClientOptions(server_address=address, credentials="nope", ssl_context=context),
                "the client token is wrong",
            ),
            (ClientOptions(server_address=address, credentials="c-secret"), "verification"),
        ]
        with trio.fail_after(BOUND):
            await worker.wait_pull_registered()
            results = await trio.to_thread.run_sync(flavour, good, refused)
        assert results == [f"Hello, TLS {i}!" for i in range(4)]
        await worker.close()
