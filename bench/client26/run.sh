#!/usr/bin/env bash
# The latency table of issue 35 with Queen's real 2.6 Python client as the load generator
# (bench/client26/latency.py): patterns × offered rate × partitions, ROUNDS rounds alternating,
# one release broker on a private durable PostgreSQL (fsync on) on loopback. Writes one JSON
# line per run to bench/results/client26-latency.jsonl and prints them.
#
#   bash bench/client26/run.sh                         # the table (2 rounds)
#   ROUNDS=1 RATES="2000" PARTITIONS="100" bash bench/client26/run.sh
#   QUEEN_BROKER_BIN=path/to/queen-broker bash bench/client26/run.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/support/private-pg.sh
source "$root/tests/support/private-pg.sh"
target=${CARGO_TARGET_DIR:-$root/target}
broker_bin=${QUEEN_BROKER_BIN:-$target/release/queen-broker}
venv=${QUEEN_VENV26:-$target/compat-venv-2.6.0}
rounds=${ROUNDS:-2}
rates=${RATES:-"2000 20000"}
partitions_list=${PARTITIONS:-"100 10000"}
patterns=${PATTERNS:-"default oldstyle"}
seconds=${SECONDS_PER_RUN:-20}
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

: >"$out.tmp"
for round in $(seq "$rounds"); do
    for partitions in $partitions_list; do
        for rate in $rates; do
            for pattern in $patterns; do
                # Push calls of at least 10 messages, at most ~200 calls a second in all: the
                # client's own CPU per call is what limits it at the higher rate.
                batch=$(( rate / 200 > 10 ? rate / 200 : 10 ))
                line=$("$venv/bin/python" "$root/bench/client26/latency.py" \
                    --url "http://127.0.0.1:$port" --pattern "$pattern" --rate "$rate" \
                    --partitions "$partitions" --seconds "$seconds" --batch "$batch" 2>/dev/null \
                    | grep '^{')
                echo "{\"round\": $round, \"batch\": $batch, ${line#\{}" | tee -a "$out.tmp"
            done
        done
    done
done
mv "$out.tmp" "$out"
