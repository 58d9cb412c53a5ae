#!/usr/bin/env bash
# What recording metrics costs the push path: the bench's push suite with QUEEN_METRICS=true
# and QUEEN_METRICS=false, alternating in every round (ABAB…, order flipped each round), on the
# same machine in one invocation; prints each round's msg/s and the median of the per-round
# ratios (on / off) per batch size, and the broker's CPU per message. `metrics_cost` (same
# crate) measures the recording itself per request, free of the machine's noise.
# docs/history/benchmarks.md, "Metrics cost", has a run.
#
#   cargo build --release --bins && cargo build --release -p queen-bench
#   bash bench/metrics-cost.sh            # ROUNDS=5 DURATION=5 BATCHES=1,100 PARTITIONS=100
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
bench=$target/release/bench
rounds=${ROUNDS:-5}
out=$(mktemp -d -t queen-metrics-cost-XXXXXX)
trap 'rm -rf "$out"' EXIT
[ -x "$bench" ] || { echo "metrics-cost: build the bench first (cargo build --release -p queen-bench)" >&2; exit 2; }
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order="true false"; else order="false true"; fi
    for metrics in $order; do
        echo "metrics-cost: round $r, QUEEN_METRICS=$metrics" >&2
        "$bench" --suites push --no-baselines --rounds 1 \
            --partitions "${PARTITIONS:-100}" --batches "${BATCHES:-1,100}" --dedup on \
            --duration "${DURATION:-5}" --warmup 1 \
            --broker-env "QUEEN_METRICS=$metrics" --json "$out/$metrics-$r.json" >/dev/null
    done
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rates = {}  # (batch, metrics) -> [(msg/s, broker CPU µs per message) per round]
for r in range(1, rounds + 1):
    for metrics in ("true", "false"):
        doc = json.load(open(f"{out}/{metrics}-{r}.json"))
        for m in doc["measurements"]:
            batch = m["scenario"]["kind"]["broker"]["batch"]
            cpu = m["cpu"]["broker"] / m["msgs_per_sec"] * 1e6
            rates.setdefault((batch, metrics), []).append((m["msgs_per_sec"], cpu))
print("| batch | round | on: msg/s | off: msg/s | on / off | on: broker CPU µs/msg | off: broker CPU µs/msg |")
print("| --- | --- | --- | --- | --- | --- | --- |")
med = statistics.median
for batch in sorted({b for b, _ in rates}):
    on, off = rates[(batch, "true")], rates[(batch, "false")]
    ratios = [a[0] / b[0] for a, b in zip(on, off)]
    for i, (a, b, q) in enumerate(zip(on, off, ratios), 1):
        print(f"| {batch} | {i} | {a[0]:,.0f} | {b[0]:,.0f} | {q:.3f} | {a[1]:.2f} | {b[1]:.2f} |")
    print(f"| {batch} | median | {med(a for a, _ in on):,.0f} | {med(a for a, _ in off):,.0f} | "
          f"**{med(ratios):.3f}** | {med(c for _, c in on):.2f} | {med(c for _, c in off):.2f} |")
PY
