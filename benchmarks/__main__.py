"""``python -m benchmarks [--quick] [--only PREFIX] [--json PATH]``: run every benchmark, print a
table, write JSON. Each figure comes with a baseline measured in the same run."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import platform
import sys
import time
from pathlib import Path

from ._harness import Benchmark, Result


def discover() -> list[Benchmark]:
    """Every ``BENCHMARKS`` entry of every ``benchmarks/bench_*.py`` module, in name order."""
    found: list[Benchmark] = []
    package = Path(__file__).parent
    for module in sorted(pkgutil.iter_modules([str(package)]), key=lambda m: m.name):
        if module.name.startswith("bench_"):
            found.extend(importlib.import_module(f"benchmarks.{module.name}").BENCHMARKS)
    return found


def format_table(results: list[Result]) -> str:
    rows = [("benchmark", "value", "unit", "baseline", "baseline value", "ratio")]
    for r in results:
        rows.append(
            (
                r.name,
                f"{r.value:,.6g}",
                r.unit,
                r.baseline,
                f"{r.baseline_value:,.6g}",
                f"{r.ratio:.2f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes; well under a minute")
    parser.add_argument("--only", metavar="PREFIX", help="run only benchmarks named PREFIX...")
    parser.add_argument(
        "--json", metavar="PATH", default="bench-results.json", help="where to write the results"
    )
    args = parser.parse_args(argv)
    results: list[Result] = []
    for bench in discover():
        if args.only and not bench.name.startswith(args.only):
            continue
        start = time.perf_counter()
        print(f"running {bench.name} ...", file=sys.stderr, flush=True)
        results.extend(bench.run(args.quick))
        print(f"  {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    print(format_table(results))
    for r in results:
        if r.notes:
            print(f"note: {r.name}: {r.notes}")
    document = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "quick": args.quick,
        "results": [r.as_json() for r in results],
    }
    Path(args.json).write_text(json.dumps(document, indent=2) + "\n")
    print(f"results written to {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
