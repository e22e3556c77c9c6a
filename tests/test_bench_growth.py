"""The growth benchmarks' table: one row per N against the smallest N, raw rows at the same N."""

from __future__ import annotations

from benchmarks import bench_growth
from benchmarks.bench_growth import _label, _rows


def test_labels_name_n_in_thousands_and_millions() -> None:
    assert [_label(n) for n in (10, 1_000, 100_000, 1_000_000)] == ["10", "1k", "100k", "1M"]


def test_each_n_is_measured_against_the_smallest_n_and_raw_at_the_same_n() -> None:
    rows = _rows("x", "us", {1_000: 2.0, 10_000: 4.0}, raw={1_000: 1.0, 10_000: 1.0})
    assert [r.name for r in rows] == ["growth.x.1k", "growth.x.1k.vs_trio", "growth.x.10k",
                                      "growth.x.10k.vs_trio"]  # fmt: skip
    assert rows[2].baseline_value == 2.0 and rows[2].ratio == 0.5
    assert rows[3].baseline_value == 1.0 and rows[3].ratio == 0.25


def test_an_o_log_n_row_is_measured_against_the_smallest_n_scaled_by_log_n() -> None:
    rows = _rows("o", "us", {1_000: 1.0, 1_000_000: 2.0}, log_scaled=True)
    assert rows[1].baseline_value == 2.0 and rows[1].ratio == 1.0


def test_quick_mode_runs_the_in_process_rows() -> None:
    rows = bench_growth.call_backlog(True)
    assert [r.name for r in rows] == [
        "growth.call_backlog.0",
        "growth.call_backlog.10k",
        "growth.call_backlog.100k",
    ]
    assert all(r.value > 0 and r.baseline_value > 0 for r in rows)


def test_the_gc_rows_give_the_cyclic_gcs_share_of_each_ns_cpu_per_spawn() -> None:
    found = {1_000: {"cpu": 40e-6, "gc_full": 0.0, "gc_young": 4e-6},
             100_000: {"cpu": 60e-6, "gc_full": 15e-6, "gc_young": 3e-6}}  # fmt: skip
    rows = {r.name: r for r in bench_growth._gc_rows(found)}
    assert sorted(rows) == ["growth.spawn.gc_full.100k", "growth.spawn.gc_full.1k",
                            "growth.spawn.gc_young.100k", "growth.spawn.gc_young.1k"]  # fmt: skip
    assert rows["growth.spawn.gc_full.100k"].ratio == 0.25
    assert rows["growth.spawn.gc_young.1k"].value == 4.0


def test_a_mesh_connect_is_shared_among_the_handshakes_each_node_has_in_flight() -> None:
    assert bench_growth._per_peer({2: 2.5, 4: 9.0, 8: 17.5}) == {2: 2.5, 4: 3.0, 8: 2.5}
