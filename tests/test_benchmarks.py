"""The benchmark runner's own behaviour: progress, ``--only``, ``--plot`` and ``--from``.

No real benchmark runs here (performance is measured in ``benchmarks/``, never in tests): the
runs use tiny fake benchmarks and the plots hand-made results.
"""

from __future__ import annotations

import json
import math
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import trio

from benchmarks.__main__ import main
from benchmarks._harness import Benchmark, Result, run_all, select
from benchmarks._plot import axis_range, render_svg
from benchmarks._results import read_results

SVG = "{http://www.w3.org/2000/svg}"

RESULTS = [
    Result("local.send", "messages/s", 900_000.0, "trio channel send_nowait", 1_200_000.0),
    Result("local.spawn", "us", 20.0, "trio start_soon", 40.0, "lower"),
    Result("dirty.execute", "us", 80.0, "raw unix ping-pong", 60.0, "lower"),
    Result("wire.<odd> & name", "ops/s", 5e6, "base <&> line", 1e5, notes="n"),
]


def _parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def _by_class(root: ET.Element, name: str) -> list[ET.Element]:
    return [e for e in root.iter() if e.get("class") == name]


def _texts(root: ET.Element) -> list[str]:
    return [e.text or "" for e in root.iter(f"{SVG}text")]


def test_the_plot_is_svg_with_one_bar_per_figure() -> None:
    root = _parse(render_svg(RESULTS))
    bars = _by_class(root, "bar")
    assert len(bars) == len(RESULTS) == len(_by_class(root, "figure"))
    # Grouped by benchmark, in the order measured.
    groups = [g.find(f"{SVG}text") for g in _by_class(root, "group")]
    assert [g.text for g in groups if g is not None] == ["local", "dirty", "wire"]


def test_the_plot_marks_1_0_and_bars_start_there() -> None:
    root = _parse(render_svg(RESULTS))
    (parity,) = _by_class(root, "parity")
    x = float(parity.get("x1", "nan"))
    assert x == float(parity.get("x2", "nan"))
    assert any("1.0" in t for t in _texts(root))
    bars = _by_class(root, "bar")
    better = [b for b in bars if b.get("fill") == "#2e7d32"]
    worse = [b for b in bars if b.get("fill") == "#c62828"]
    # local.spawn (2x) and wire (50x) beat their baselines; local.send and dirty trail theirs.
    assert len(better) == 2 and len(worse) == 2
    for bar in better:
        assert math.isclose(float(bar.get("x", "nan")), x)
    for bar in worse:
        left, width = float(bar.get("x", "nan")), float(bar.get("width", "nan"))
        assert math.isclose(left + width, x, abs_tol=0.15)


def test_the_axis_is_logarithmic_so_twice_and_half_are_equally_far_from_1() -> None:
    half_and_twice = [
        Result("a.half", "x/s", 1.0, "b", 2.0),
        Result("a.twice", "x/s", 2.0, "b", 1.0),
    ]
    root = _parse(render_svg(half_and_twice))
    widths = [float(b.get("width", "nan")) for b in _by_class(root, "bar")]
    assert widths[0] > 10 and math.isclose(widths[0], widths[1], abs_tol=0.15)
    low, high, ticks = axis_range([0.03, 40.0])
    assert low <= 0.03 and high >= 40 and 1.0 in ticks


def test_names_with_markup_characters_are_escaped() -> None:
    svg = render_svg(RESULTS, subtitle="from <a&b>.json")
    root = _parse(svg)
    texts = _texts(root)
    assert "wire.<odd> & name" in texts
    assert any("base <&> line" in t for t in texts)
    assert "from <a&b>.json" in texts
    assert "<odd>" not in svg


def test_a_figure_that_was_not_measured_has_no_bar_but_a_label() -> None:
    root = _parse(render_svg([Result("matching.rpc_latency", "us", 0.0, "floor", 30.0, "lower")]))
    assert _by_class(root, "bar") == []
    assert [e.text for e in _by_class(root, "unmeasured")] == ["not measured"]


def _fake(name: str, figures: int) -> Benchmark:
    def run(quick: bool) -> list[Result]:
        print("measuring", flush=True)  # a benchmark's own output stays out of the progress
        return [Result(f"{name}.{i}", "ops/s", 2.0, "base", 1.0) for i in range(figures)]

    return Benchmark(name, run)


def test_progress_names_each_benchmark_and_how_far_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    results = run_all([_fake("fake.a", 1), _fake("fake.b", 3)], True, sys.stderr)
    assert len(results) == 4
    out, err = capsys.readouterr()
    assert out == "measuring\nmeasuring\n"  # the table's stream carries no progress
    lines = err.splitlines()
    assert lines[0] == "[1/2] fake.a ..."
    assert lines[1].startswith("[1/2] fake.a ... ") and lines[1].endswith(" s, 1 figure")
    assert lines[2] == "[2/2] fake.b ..."
    assert lines[3].endswith(" s, 3 figures")
    assert lines[4].startswith("2 benchmarks, 4 figures in ")


def test_only_takes_several_prefixes_and_rejects_one_that_matches_nothing() -> None:
    benches = [_fake(n, 1) for n in ("local.send", "local.call", "dirty", "wire.frames")]
    assert [b.name for b in select(benches, [])] == [b.name for b in benches]
    assert [b.name for b in select(benches, ["dirty", "local.c"])] == ["local.call", "dirty"]
    with pytest.raises(ValueError, match="--only nope matches no benchmark"):
        select(benches, ["wire", "nope"])


def test_only_is_repeatable_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps({"results": [r.as_json() for r in RESULTS]}))
    assert main(["--from", str(saved), "--only", "local", "--only", "wire"]) == 0
    table = capsys.readouterr().out
    assert "local.send" in table and "wire.<odd>" in table and "dirty.execute" not in table


def test_plot_from_a_saved_results_file_runs_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "results.json"
    saved.write_text(json.dumps({"quick": True, "results": [r.as_json() for r in RESULTS]}))
    plot = tmp_path / "out.svg"
    assert main(["--plot", str(plot), "--from", str(saved), "--json", str(tmp_path / "j")]) == 0
    assert len(_by_class(_parse(plot.read_text()), "bar")) == len(RESULTS)
    assert not (tmp_path / "j").exists()  # --from does not overwrite results with themselves
    assert "[1/" not in capsys.readouterr().err
    assert read_results(saved).results == RESULTS


def test_a_results_file_from_before_direction_was_saved_still_reads(tmp_path: Path) -> None:
    old = [{k: v for k, v in r.as_json().items() if k != "direction"} for r in RESULTS]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"results": old}))
    assert [r.direction for r in read_results(path).results] == [r.direction for r in RESULTS]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "cannot read it"),
        ("{not json", "not JSON"),
        ('{"results": 3}', 'no "results" list'),
        ('{"results": [{"name": "a"}]}', "'unit' must be a string"),
        (
            '{"results": [{"name": "a", "unit": "u", "baseline": "b", "value": "fast",'
            ' "baseline_value": 1, "direction": "higher"}]}',
            "'value' must be a number",
        ),
        (
            '{"results": [{"name": "a", "unit": "u", "baseline": "b", "value": NaN,'
            ' "baseline_value": 1, "direction": "higher"}]}',
            "must be finite",
        ),
    ],
)
def test_from_a_missing_or_garbled_file_is_one_clear_error_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, says: str
) -> None:
    path = tmp_path / "results.json"
    if content is not None:
        path.write_text(content)
    plot = tmp_path / "out.svg"
    assert main(["--plot", str(plot), "--from", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"python -m benchmarks: error: --from {path}: ")
    assert says in line
    assert not plot.exists()


async def test_the_wakeup_counter_counts_each_task_wakeup_inside_its_block() -> None:
    import trio

    from benchmarks._wakeups import counting_wakeups

    send, receive = trio.open_memory_channel[int](0)

    async def echo() -> None:
        async for n in receive:
            del n

    async with trio.open_nursery() as nursery:
        nursery.start_soon(echo)
        await trio.testing.wait_all_tasks_blocked()
        with counting_wakeups() as counter:
            for n in range(10):
                await send.send(n)
        after = counter.count
        await trio.sleep(0)
        nursery.cancel_scope.cancel()
    # each send wakes the parked receiver (and a rendezvous send parks and is woken once too)
    assert 10 <= after <= 30
    assert counter.count == after


def test_bench_dirty_raw_pingpong_echoes_from_another_process(tmp_path: Path) -> None:
    import threading

    from benchmarks.bench_dirty import _raw_pingpong

    threads = set(threading.enumerate())
    took = _raw_pingpong(str(tmp_path / "raw.sock"), 20)
    # the echo ran in a process of its own (only the sender thread, now ended, was ours); a
    # thread another test left (an idle one of trio's cache) may end meanwhile: no new one stays
    assert set(threading.enumerate()) <= threads
    assert 0 < took < 1
    assert not (tmp_path / "raw.sock").exists()


def test_bench_dirty_floor_reports_latency_rate_and_each_process_cpu() -> None:
    from benchmarks.bench_dirty import _floor_rig

    with _floor_rig(2) as floor:
        floor.one(20)
        floor.many(0.05)
    assert len(floor.latencies) == 20 and 0 < floor.latency() < 1
    assert floor.rate() > 0
    for callers in (1, 2):
        forwarder, wakeups, echoes, bare = floor.per_call(callers)
        assert forwarder >= 0 and echoes >= 0 and bare >= 0
        assert math.isnan(wakeups)  # (the forwarder's are not counted)


def test_bench_dirty_shared_floor_client_hands_each_caller_its_own_reply() -> None:
    import socket
    import threading

    from benchmarks._dirty_shared import SharedConn

    here, there = socket.socketpair()
    sent: dict[int, list[bytes]] = {}

    class Recorded:  # the client's socket, noting which thread sent which record
        def __getattr__(self, name: str) -> object:
            return getattr(here, name)

        def sendall(self, data: bytes) -> None:
            sent.setdefault(threading.get_ident(), []).append(data[1:9])
            here.sendall(data)

    def peer() -> None:  # a forwarder that answers every batch it reads last record first
        there.sendall(b"\x07")
        pending = b""
        while data := there.recv(1 << 16):
            pending += data
            end = len(pending) - len(pending) % 16
            records = [pending[i : i + 16] for i in range(0, end, 16)]
            there.sendall(b"".join(reversed(records)))
            pending = pending[end:]

    threading.Thread(target=peer, daemon=True).start()
    conn = SharedConn(Recorded(), 16)  # type: ignore[arg-type]
    got: dict[int, list[bytes]] = {}

    def caller() -> None:
        mine = got.setdefault(threading.get_ident(), [])
        for _ in range(100):
            reply = conn.call()
            assert reply[:1] == b"\x07" and len(reply) == 16
            mine.append(reply[1:9])

    callers = [threading.Thread(target=caller) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    conn.close()
    there.close()
    assert got == sent and sum(map(len, got.values())) == 400
    assert len({rid for rids in got.values() for rid in rids}) == 400


def test_bench_dirty_shared_floor_runs_one_connection_and_reports_each_cost() -> None:
    import threading

    from benchmarks.bench_dirty import _floor_rig

    threads = set(threading.enumerate())
    with _floor_rig(4, shared=True) as floor:
        call = floor.calls[0]
        assert len(floor.calls) == 4 and all(c == call for c in floor.calls)  # one connection
        floor.one(20)
        floor.many(0.05)
    assert 0 < floor.latency() < 1 and floor.rate() > 0
    for callers in (1, 4):
        forwarder, wakeups, echoes, client = floor.per_call(callers)
        assert forwarder >= 0 and echoes >= 0 and client >= 0 and math.isnan(wakeups)
    assert set(threading.enumerate()) <= threads  # (its reader thread ended with the rig)


def test_bench_dirty_ours_and_the_floor_alternate_with_the_order_flipped_each_round() -> None:
    from benchmarks.bench_dirty import _alternate, _Side

    probed: list[str] = []  # (a slice probes its side's counters as it begins and ends)

    def side(name: str) -> _Side:
        return _Side([lambda: None], lambda: (probed.append(name), (0.0, 0.0, 0.0))[1])

    ours, floor = side("ours"), side("floor")
    _alternate([ours, floor], quick=True)
    slices = probed[::2]
    # round 1: ours, floor (1 caller), ours, floor (all callers); round 2 the other way round
    assert slices == ["ours", "floor", "ours", "floor", "floor", "ours", "floor", "ours"]
    assert len(ours.latencies) == len(floor.latencies) > 0
    assert ours.made > 0 and floor.made > 0


def test_bench_dirty_wakeups_are_counted_in_slices_of_their_own_after_the_timed_ones() -> None:
    from benchmarks.bench_dirty import _alternate, _Side

    switched: list[bool] = []
    count = [0.0]

    def call() -> None:
        count[0] += 2 if switched[-1:] == [True] else 0  # (counted only while on)

    def toggle(on: bool) -> float:
        switched.append(on)
        return count[0]

    ours = _Side([call, call], lambda: (0.0, count[0], 0.0), toggle)
    _alternate([ours], quick=True)
    assert switched == [True, False]
    assert ours.wakeups == {1: 2.0, 2: 2.0}
    assert ours.per_call(1)[1] == ours.per_call(2)[1] == 0  # the timed slices: counter off


def test_bench_dirty_probe_counts_the_nodes_cpu_and_its_wakeups_only_while_asked(
    tmp_path: Path,
) -> None:
    from apps import dirty
    from benchmarks.bench_dirty import (
        _COUNT_OFF,
        _COUNT_ON,
        APP,
        _probe_node,
        _signal_node,
        _start_pool,
        _stop,
    )

    path, report = str(tmp_path / "pool.sock"), str(tmp_path / "wakeups")
    proc = _start_pool(path, report)
    try:
        with dirty.DirtyClient(path, timeout=10) as client:
            cpu0, wakeups0, workers0 = _probe_node(proc.pid, report)
            for _ in range(50):
                client.execute(APP, "echo", "x")
            cpu1, wakeups1, workers1 = _probe_node(proc.pid, report)
            on = _signal_node(proc.pid, report, _COUNT_ON)
            for _ in range(50):
                client.execute(APP, "echo", "x")
            _, counted, _ = _probe_node(proc.pid, report)
            off = _signal_node(proc.pid, report, _COUNT_OFF)
            for _ in range(50):
                client.execute(APP, "echo", "x")
            _, after, _ = _probe_node(proc.pid, report)
    finally:
        _stop(proc)
    # the timed slices run without the counter (it costs the node a hook per wake-up)
    assert wakeups1 == wakeups0 == on
    # each call wakes the node's connection reader and its worker reader at least
    assert counted - on >= 50
    assert after == off >= counted
    assert cpu1 > cpu0 and workers1 > workers0 > 0


def test_bench_dirty_floor_notes_name_each_process_cost_and_whether_wires_c_paths_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import benchmarks.bench_dirty as bench_dirty
    from benchmarks.bench_dirty import _cost_notes, _Side

    # 100 calls by 8 callers: node 3 ms of CPU, workers 2 ms, client 4 ms; 5 node wake-ups a call
    ours = _Side([], lambda: (0.0, 0.0, 0.0), made=100, spent={8: [3e-3, 0.0, 2e-3, 4e-3]})
    ours.wakeups[8] = 5.0
    floor = _Side([], lambda: (0.0, math.nan, 0.0), made=200, spent={8: [4e-3, 0.0, 2e-3, 2e-3]})
    for paths in ("C fast paths on", "pure Python (C fast paths off: ...)"):
        monkeypatch.setattr(bench_dirty, "WIRE_PATHS", paths)
        assert _cost_notes(ours, floor, 8) == (
            "; CPU us/call: node 30 (forwarder 20), workers 20 (echoes 10), client 40 (bare"
            f" callers 10); 5.0 node wake-ups/call; wire: {paths}"
        )
    assert "client 40 (sharing callers 10)" in _cost_notes(ours, floor, 8, "sharing callers")


async def test_bench_remote_calls_and_the_trio_floor_alternate_flipping_the_order() -> None:
    from benchmarks.bench_remote import _alternate

    ran: list[str] = []

    def side(name: str) -> Callable[[], Awaitable[None]]:
        async def one() -> None:
            ran.append(name)
            await trio.lowlevel.checkpoint()

        return one

    ours, floor, floor_cpu = await _alternate(side("ours"), side("floor"), 6, rounds=3)
    assert len(ours) == len(floor) == 6
    assert all(t >= 0 for t in ours + floor) and floor_cpu >= 0
    # (2 round trips a slice; round 1: ours, floor; round 2 the other way round; round 3 as 1)
    slices = ran[::2]
    assert slices == ["ours", "floor", "floor", "ours", "ours", "floor"]
    assert ran == [name for name in slices for _ in range(2)]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_bench_remote_places_calls_and_floor_alike_and_restores_affinity() -> None:
    from benchmarks.bench_remote import _pinned, _placements

    before = os.sched_getaffinity(0)
    cpus = sorted(before)
    placements = _placements()
    assert placements["one CPU"].here == placements["one CPU"].peers == {cpus[0]}
    if len(cpus) >= 2:
        assert list(placements) == ["two CPUs", "one CPU"]  # (the main row's first)
        assert (placements["two CPUs"].here, placements["two CPUs"].peers) == ({cpus[0]}, {cpus[1]})
    else:
        assert list(placements) == ["one CPU"]
    with _pinned({cpus[-1]}):
        assert os.sched_getaffinity(0) == {cpus[-1]}
    assert os.sched_getaffinity(0) == before


def test_bench_supervisors_logs_as_the_node_does_without_the_burst_limit_and_puts_it_back() -> None:
    import logging

    import otp
    from benchmarks.bench_supervisors import _node_logging

    root = logging.getLogger()
    before = root.handlers[:], root.level
    with _node_logging():
        (handler,) = root.handlers
        assert isinstance(handler.formatter, otp.ReportFormatter)
        assert root.level == logging.INFO
        # (a crash storm is what restart_crash measures: every report must be written)
        assert not any(isinstance(f, otp.BurstLimit) for f in handler.filters)
    assert (root.handlers, root.level) == before
