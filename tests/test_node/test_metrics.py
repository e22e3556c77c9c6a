"""``otp.node``'s Prometheus metrics (``_metrics.exposition``, what ``/metrics`` serves):
names by Prometheus conventions, the run queue, and restarts by supervisor and by child."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from test_otp.peer import COOKIE, PeerNode

import otp
import supervisors
from otp.node._metrics import exposition
from supervisors import ChildSpec, Supervisor


class Worker(otp.GenServer):
    def handle_call(self, request: Any, from_: otp.From, state: Any) -> otp.Reply:
        return otp.Reply(state, state)


class Root(Supervisor):
    def init(self) -> Any:
        return {"strategy": "one_for_one", "intensity": 5}, [
            ChildSpec("worker", Worker),
            ChildSpec("other", Worker),
        ]


async def _families() -> dict[str, Any]:
    body, _content_type = exposition(otp.observer.snapshot(), await supervisors.observe())
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


async def test_metric_names_follow_prometheus_conventions() -> None:
    async with otp.open_node("metrics@localhost"):
        await supervisors.start_application(supervisors.Application("demo", Root))
        families = await _families()
        ours = {name: f for name, f in families.items() if name.startswith("otp_")}
        for name in ("otp_processes", "otp_run_queue_processes", "otp_child_restarts"):
            assert name in ours
        for name, family in ours.items():
            assert re.fullmatch(r"otp(_[a-z0-9]+)+", name), name
            if family.type == "counter":
                assert all(s.name.endswith("_total") for s in family.samples), name
            assert not re.search(r"_(ms|milliseconds|kb|kilobytes)\b", name), name
        await supervisors.stop_all_applications()


async def test_restarts_are_counted_by_child() -> None:
    async with otp.open_node("metrics@localhost"):
        await supervisors.start_application(supervisors.Application("demo", Root))
        root = supervisors.application_supervisor("demo")
        children = {child_id: pid for child_id, pid, _, _ in await supervisors.which_children(root)}
        otp.monitor(children["worker"])
        otp.exit(children["worker"], otp.KILL)
        await otp.receive(otp.Down)
        await supervisors.which_children(root)  # (answered once the restart is done)
        samples = {
            s.labels["child"]: s.value for s in (await _families())["otp_child_restarts"].samples
        }
        assert samples == {"worker": 1, "other": 0}
        run_queue = (await _families())["otp_run_queue_processes"].samples[0].value
        assert 0 <= run_queue <= len(otp.observer.observe_processes())
        await supervisors.stop_all_applications()


async def test_distribution_bytes_are_counted_per_peer_node(tmp_path: Path) -> None:
    b_address = f"unix:{tmp_path / 'b'}.sock"
    async with PeerNode("b@localhost", b_address):
        async with otp.open_node("metrics@localhost"):
            await otp.start_distribution(otp.DistConfig(cookie=COOKIE))
            assert await otp.connect("b@localhost", b_address)
            assert await otp.call(("echo", "b@localhost"), b"x" * 10_000) == b"x" * 10_000
            snapshot = otp.observer.snapshot()
            body, _content_type = exposition(snapshot, [])
            families = {f.name: f for f in text_string_to_metric_families(body.decode())}
            (conn,) = snapshot.connections
            for name, counted in (
                ("otp_dist_bytes_sent", conn.bytes_written),
                ("otp_dist_bytes_received", conn.bytes_received),
            ):
                (sample,) = families[name].samples
                assert sample.name == f"{name}_total"
                assert sample.labels == {"node": "b@localhost"}
                assert sample.value == counted > 10_000
