"""The short summary ``make bench`` ends with: one line per benchmark from pytest-benchmark's JSON.

    python scripts/bench_summary.py .benchmarks/last.json

Columns: the group, the benchmark (its parameters), calls per second (one call handles one image
in the image benchmarks), and the speed relative to the group's first benchmark, the reference.
"""

from __future__ import annotations

import json
import sys


def summary(data: dict) -> str:
    rows: list[tuple[str, str, float, float]] = []
    reference: dict[str, float] = {}
    for bench in data.get("benchmarks", []):
        group = bench.get("group") or "-"
        ops = float(bench["stats"]["ops"])
        reference.setdefault(group, ops)
        rows.append((group, bench["name"].removeprefix("test_"), ops, ops / reference[group]))
    if not rows:
        return "no benchmarks ran"
    wg = max(len("group"), *(len(r[0]) for r in rows))
    wn = max(len("operation"), *(len(r[1]) for r in rows))
    lines = [f"{'group':<{wg}}  {'operation':<{wn}}  {'per s':>10}  {'x ref':>6}"]
    lines += [f"{g:<{wg}}  {n:<{wn}}  {ops:>10.0f}  {rel:>6.2f}" for g, n, ops, rel in rows]
    lines.append("(x ref: speed relative to the first benchmark of its group)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: bench_summary.py BENCHMARK.json\n")
        return 2
    with open(argv[0], encoding="utf-8") as f:
        sys.stdout.write(summary(json.load(f)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
