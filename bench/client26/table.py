"""The markdown table of one series of bench/results/client26-latency.jsonl (run.sh): one row
per pattern × fraction × partitions, the rounds' values separated by " / ".

    python3 bench/client26/table.py SERIES
"""

import json
import sys
from collections import defaultdict
from pathlib import Path

series = sys.argv[1]
path = Path(__file__).resolve().parents[2] / "bench/results/client26-latency.jsonl"
rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
rows = [r for r in rows if r.get("series") == series]

push = defaultdict(list)
cells = defaultdict(list)
for r in rows:
    if r["pattern"] == "push-only":
        push[r["partitions"]].append(r)
    else:
        cells[(r["partitions"], r["fraction"], r["pattern"])].append(r)


def join(values, fmt):
    return " / ".join(fmt(v) for v in values)


def num(v):
    return "–" if v is None else f"{v:,.0f}".replace(",", " ")


def ms(v):
    return "–" if v is None else (f"{v:.1f}" if v < 10 else f"{v:.0f}")


print("| partitions | push-only msg/s (client flat out) | producers' CPU-s | load avg |")
print("|---|---|---|---|")
for parts, rs in sorted(push.items()):
    print(f"| {num(parts)} | {join([r['producedRate'] for r in rs], num)} "
          f"| {join([r['producersCpuSeconds'] for r in rs], lambda v: f'{v:.1f}')} "
          f"| {join([max(r.get('loadAvg') or [0]) for r in rs], lambda v: f'{v:.0f}' if v else '–')} |")
print()
names = {"default": "defaults (autopilot)", "oldstyle": "old-style", "pinned": "pinned"}
print("| pattern | partitions | load | offered msg/s | produced msg/s | consumed ÷ produced "
      "| p50 ms | p90 ms | p99 ms | max ms | CPU-s prod. / cons. | load avg |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
order = {"default": 0, "oldstyle": 1, "pinned": 2}
for (parts, frac, pattern), rs in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])):
    print(f"| {names[pattern]} | {num(parts)} | {frac * 100:g} % "
          f"| {join([r['offeredRate'] for r in rs], num)} "
          f"| {join([r['producedRate'] for r in rs], num)} "
          f"| {join([r['consumedOverProduced'] for r in rs], lambda v: f'{v:.3f}')} "
          f"| {join([r['p50Ms'] for r in rs], ms)} | {join([r['p90Ms'] for r in rs], ms)} "
          f"| **{join([r['p99Ms'] for r in rs], ms)}** | {join([r['maxMs'] for r in rs], ms)} "
          f"| {join([(r['producersCpuSeconds'], r['consumersCpuSeconds']) for r in rs], lambda v: f'{v[0]:.0f}/{v[1]:.0f}')} "
          f"| {join([max(r.get('loadAvg') or [0]) for r in rs], lambda v: f'{v:.0f}' if v else '–')} |")
