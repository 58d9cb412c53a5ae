#!/usr/bin/env bash
# The latency table of issue 35 with Queen's real 2.6 Python client as the load generator
# (bench/client26/latency.py, several producer and consumer processes): per round and partition
# count, first the push-only rate this client setup reaches flat out (no consumers), then every
# pattern paced at FRACTIONS of that rate; one release broker on a private durable PostgreSQL
# (fsync on) on loopback. Appends one JSON line per run, tagged with SERIES, to
# bench/results/client26-latency.jsonl and prints them.
#
#   bash bench/client26/run.sh                         # the table (2 rounds)
#   ROUNDS=1 FRACTIONS="0.05" PARTITIONS="100" PATTERNS="pinned" bash bench/client26/run.sh
#   QUEEN_BROKER_BIN=path/to/queen-broker bash bench/client26/run.sh
#
# The pinned pattern (one pinned consume() per partition) runs only up to PINNED_MAX_PARTITIONS
# partitions (100): at 10 000 partitions it would be 10 000 long polls from a handful of
# processes, each client holding at most 100 connections.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/support/private-pg.sh
source "$root/tests/support/private-pg.sh"
target=${CARGO_TARGET_DIR:-$root/target}
broker_bin=${QUEEN_BROKER_BIN:-$target/release/queen-broker}
venv=${QUEEN_VENV26:-$target/compat-venv-2.6.0}
rounds=${ROUNDS:-2}
first_round=${FIRST_ROUND:-1}  # the number of the first round (to continue a series)
fractions=${FRACTIONS:-"0.05 0.5"}
partitions_list=${PARTITIONS:-"100 10000"}
patterns=${PATTERNS:-"default oldstyle pinned"}
pinned_max=${PINNED_MAX_PARTITIONS:-100}
seconds=${SECONDS_PER_RUN:-15}
push_seconds=${PUSH_ONLY_SECONDS:-10}
series=${SERIES:-procs-$(date -u +%Y-%m-%dT%H:%M)}
out=$root/bench/results/client26-latency.jsonl

tmp=$(mktemp -d -t queen-lat26-XXXXXX)
broker_pid=""
cleanup() {
    if [ -n "$broker_pid" ]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
    stop_private_pg
    rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "${QUEEN_BROKER_BIN:-}" ]; then
    (cd "$root" && cargo build --release --quiet --bin queen-broker)
fi
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/tests/compat/requirements-2.6.txt"

PRIVATE_PG_DURABLE=1 start_private_pg lat26
port=$(free_port)
mkdir -p "$tmp/spool"
HOST=127.0.0.1 PORT=$port FILE_BUFFER_DIR="$tmp/spool" LOG_LEVEL=warn QUEEN_CONFIG="" \
    "$broker_bin" >"$tmp/broker.log" 2>&1 &
broker_pid=$!
for _ in $(seq 300); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1
done

# METRICS_DIR=dir keeps the broker's /metrics/prometheus after every run (counters are
# cumulative: diff consecutive files) and its log.
metrics_dir=${METRICS_DIR:-}
[ -z "$metrics_dir" ] || mkdir -p "$metrics_dir"
run_no=0
snapshot() {
    run_no=$((run_no + 1))
    [ -z "$metrics_dir" ] || curl -fs "http://127.0.0.1:$port/metrics/prometheus" \
        >"$metrics_dir/$(printf %02d $run_no)-$1.prom" || true
}
lat() {
    # shellcheck disable=SC2086  # LAT_ARGS: more latency.py options (e.g. --histogram)
    "$venv/bin/python" "$root/bench/client26/latency.py" --url "http://127.0.0.1:$port" "$@" ${LAT_ARGS:-} \
        2>>"$tmp/client.log" | grep '^{'
}
for round in $(seq "$first_round" $((first_round + rounds - 1))); do
    for partitions in $partitions_list; do
        line=$(lat --pattern push-only --partitions "$partitions" --seconds "$push_seconds" --batch 100)
        push_rate=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["producedRate"])' "$line")
        echo "{\"series\": \"$series\", \"round\": $round, ${line#\{}" | tee -a "$out"
        snapshot "r$round-$partitions-push-only"
        for fraction in $fractions; do
            rate=$(python3 -c "print(round($push_rate * $fraction))")
            # Push calls of 10 to 100 messages, at most ~200 calls a second in all.
            batch=$(( rate / 200 > 100 ? 100 : rate / 200 > 10 ? rate / 200 : 10 ))
            for pattern in $patterns; do
                if [ "$pattern" = pinned ] && [ "$partitions" -gt "$pinned_max" ]; then continue; fi
                line=$(lat --pattern "$pattern" --rate "$rate" --partitions "$partitions" \
                    --seconds "$seconds" --batch "$batch") || { echo "run failed: $pattern $rate $partitions" >&2; continue; }
                echo "{\"series\": \"$series\", \"round\": $round, \"fraction\": $fraction, \"pushOnlyRate\": $push_rate, ${line#\{}" | tee -a "$out"
                snapshot "r$round-$partitions-$fraction-$pattern"
            done
        done
    done
done
tail -n 20 "$tmp/client.log" >&2 || true
[ -z "$metrics_dir" ] || cp "$tmp/broker.log" "$metrics_dir/broker.log"
