#!/usr/bin/env bash
# kafkajs (npm, pure JavaScript) against the broker's Kafka listener (docs/kafka.md): starts the
# broker with QUEEN_KAFKA_PORT on free ports against DATABASE_URL (or a private PostgreSQL
# cluster in a temp dir when unset) and runs tests/compat/kafkajs/kafkajs.test.mjs: topic
# creation, an idempotent producer (keys, headers, none and gzip), a group of two members with a
# rebalance and a commit per record, a restart from the committed offsets, HTTP pop of a record
# produced over Kafka. Needs node and npm (the package is pinned by its package-lock.json).
# tests/compat/run.sh (so CI) runs it after kafka.sh.
#
#   bash tests/compat/kafkajs.sh                                           # builds the release broker
#   QUEEN_BROKER_BIN=path/to/queen-broker bash tests/compat/kafkajs.sh     # another binary, no build
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/support/private-pg.sh
source "$root/tests/support/private-pg.sh"
target=${CARGO_TARGET_DIR:-$root/target}
broker_bin=${QUEEN_BROKER_BIN:-$target/release/queen-broker}

if ! command -v npm >/dev/null 2>&1; then
    echo "compat-kafkajs: npm is not installed; skipped" >&2
    exit 0
fi
tmp=$(mktemp -d -t queen-compat-kafkajs-XXXXXX)
broker_pid=""
cleanup() {
    if [ -n "$broker_pid" ]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
    stop_private_pg
    rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "${QUEEN_BROKER_BIN:-}" ]; then
    echo "compat-kafkajs: building the release broker"
    (cd "$root" && cargo build --release --quiet --bin queen-broker)
fi
(cd "$root/tests/compat/kafkajs" && npm ci --silent --no-audit --no-fund)

[ -n "${DATABASE_URL:-}" ] || start_private_pg compat-kafkajs
port=$(free_port)
kafka_port=$(free_port)
mkdir -p "$tmp/spool"
HOST=127.0.0.1 PORT=$port QUEEN_KAFKA_PORT=$kafka_port FILE_BUFFER_DIR="$tmp/spool" \
    LOG_LEVEL=${LOG_LEVEL:-warn} QUEEN_CONFIG="" \
    "$broker_bin" >"$tmp/broker.log" 2>&1 &
broker_pid=$!
for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
curl -sf "http://127.0.0.1:$port/health" >/dev/null || { tail -n 50 "$tmp/broker.log" >&2; exit 1; }

echo "compat-kafkajs: kafkajs $(node -p "require('$root/tests/compat/kafkajs/node_modules/kafkajs/package.json').version") on 127.0.0.1:$kafka_port"
if ! (cd "$root/tests/compat/kafkajs" && KAFKA_BROKERS="127.0.0.1:$kafka_port" \
        HTTP_BASE="http://127.0.0.1:$port" KAFKAJS_NO_PARTITIONER_WARNING=1 timeout 300 node kafkajs.test.mjs); then
    echo "compat-kafkajs: failed; broker log (last 50 lines):" >&2
    tail -n 50 "$tmp/broker.log" >&2
    exit 1
fi
