#!/usr/bin/env bash
# Runs schemathesis (pinned in requirements.txt) against a running broker, driven by the
# broker's own OpenAPI document (GET /api/v1/openapi.json): a bounded number of generated
# requests per operation (QUEEN_OPENAPI_EXAMPLES, default 25), and fails when an answer is a
# 5xx or contradicts the document (status code, content type, body schema).
#
#   bash tests/openapi/run.sh                 # from the repository root, nothing else needed
#   DATABASE_URL=postgres://... bash tests/openapi/run.sh
#   QUEEN_BROKER_BIN=target/debug/queen-broker bash tests/openapi/run.sh   # skip the release build
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/support/private-pg.sh
source "$root/tests/support/private-pg.sh"
target=${CARGO_TARGET_DIR:-$root/target}
venv=${QUEEN_OPENAPI_VENV:-$target/openapi-venv}
python=${PYTHON:-python3}
examples=${QUEEN_OPENAPI_EXAMPLES:-25}

tmp=$(mktemp -d -t queen-openapi-XXXXXX)
broker_pid=""
cleanup() {
    if [ -n "$broker_pid" ]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
    stop_private_pg
    rm -rf "$tmp"
}
trap cleanup EXIT

broker=${QUEEN_BROKER_BIN:-}
if [ -z "$broker" ]; then
    echo "openapi: building the release broker"
    (cd "$root" && cargo build --release --quiet --bin queen-broker)
    broker=$target/release/queen-broker
fi

echo "openapi: installing the pinned schemathesis into $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/tests/openapi/requirements.txt"

[ -n "${DATABASE_URL:-}" ] || start_private_pg openapi

port=$(free_port)
mkdir -p "$tmp/spool"
HOST=127.0.0.1 PORT=$port FILE_BUFFER_DIR="$tmp/spool" LOG_LEVEL=${LOG_LEVEL:-warn} QUEEN_CONFIG="" \
    "$broker" >"$tmp/broker.log" 2>&1 &
broker_pid=$!
echo "openapi: broker on port $port"

status=0
# Run from a scratch folder holding the config, so schemathesis' caches stay out of the tree.
mkdir -p "$tmp/st"
cp "$root/tests/openapi/schemathesis.toml" "$tmp/st/"
(
    cd "$tmp/st"
    "$venv/bin/schemathesis" run "http://127.0.0.1:$port/api/v1/openapi.json" \
        --wait-for-schema 30 \
        --mode positive \
        --phases examples,coverage,fuzzing \
        --max-examples "$examples" \
        --seed "${QUEEN_OPENAPI_SEED:-1}" \
        --workers 1 \
        --request-timeout 10 \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
        --suppress-health-check all \
        --no-color
) || status=$?
if [ "$status" -ne 0 ]; then
    echo "openapi: broker log (last 50 lines):" >&2
    tail -n 50 "$tmp/broker.log" >&2
fi
exit "$status"
