#!/usr/bin/env bash
# Runs Queen's official Python client (queen-mq) against the release broker, once per pinned
# version (requirements.txt: 1.3.0; requirements-0.15.txt: 0.15.0; requirements-2.6.txt: 2.6.0):
# makes a virtual environment per version, installs the client, starts the broker on a free port
# against DATABASE_URL (or a private PostgreSQL cluster in a temp dir when unset) with a fresh
# QUEEN_ENCRYPTION_KEY, runs compat.py with the 1.x and 0.15 clients and compat26.py (the 2.x
# surfaces: KV, locks, timers, riders, ack window, reads, default consume) with the 2.6 client,
# and exits non-zero when a flow fails. QUEEN_COMPAT_STRICT=1 also fails on flows skipped because
# the broker lacks a route they need. streams26.py runs the 2.6 client's Stream runtime
# (docs/streams.md). Then tls.sh: the 2.6.0 client over HTTPS, same database; then kafka.sh:
# kcat, confluent-kafka and kafka-python on the Kafka listener (docs/kafka.md), same database;
# then kafkajs.sh: kafkajs (npm) on the Kafka listener.
# The 2.6 client's own test suite is tests/compat/suite26.sh.
#
#   bash tests/compat/run.sh                 # from the repository root, nothing else needed
#   DATABASE_URL=postgres://... bash tests/compat/run.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/support/private-pg.sh
source "$root/tests/support/private-pg.sh"
target=${CARGO_TARGET_DIR:-$root/target}
python=${PYTHON:-python3}
requirements=("$root/tests/compat/requirements.txt" "$root/tests/compat/requirements-0.15.txt")
requirements_2x="$root/tests/compat/requirements-2.6.txt"

tmp=$(mktemp -d -t queen-compat-XXXXXX)
broker_pid=""
cleanup() {
    if [ -n "$broker_pid" ]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
    stop_private_pg
    rm -rf "$tmp"
}
trap cleanup EXIT

echo "compat: building the release broker"
(cd "$root" && cargo build --release --quiet --bin queen-broker)

venvs=()
for req in "${requirements[@]}"; do
    pinned=$(grep -o 'queen-mq==[0-9.]*' "$req")
    venv=$target/compat-venv-${pinned#queen-mq==}
    echo "compat: installing $pinned into $venv"
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$req"
    venvs+=("$venv")
done
pinned=$(grep -o 'queen-mq==[0-9.]*' "$requirements_2x")
venv_2x=$target/compat-venv-${pinned#queen-mq==}
echo "compat: installing $pinned into $venv_2x"
[ -x "$venv_2x/bin/python" ] || "$python" -m venv "$venv_2x"
"$venv_2x/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements_2x"
venv=${venvs[0]}

[ -n "${DATABASE_URL:-}" ] || start_private_pg compat

port=$(free_port)
mkdir -p "$tmp/spool"
key=$("$venv/bin/python" -c 'import secrets; print(secrets.token_hex(32))')
HOST=127.0.0.1 PORT=$port FILE_BUFFER_DIR="$tmp/spool" LOG_LEVEL=${LOG_LEVEL:-warn} QUEEN_CONFIG="" \
    QUEEN_ENCRYPTION_KEY=$key \
    "$target/release/queen-broker" >"$tmp/broker.log" 2>&1 &
broker_pid=$!
"$venv/bin/python" - "$port" <<'PY'
import sys, time, httpx
url = f"http://127.0.0.1:{sys.argv[1]}/health"
for _ in range(300):
    try:
        if httpx.get(url, timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.1)
sys.exit("compat: the broker did not become healthy within 30 s")
PY
echo "compat: broker on port $port"

status=0
for v in "${venvs[@]}"; do
    echo "compat: flows with ${v##*/compat-venv-}"
    "$v/bin/python" "$root/tests/compat/compat.py" "http://127.0.0.1:$port" || status=$?
done
echo "compat: flows with ${venv_2x##*/compat-venv-}"
"$venv_2x/bin/python" "$root/tests/compat/compat26.py" "http://127.0.0.1:$port" || status=$?
# The Stream runtime's pipelines; its SIGKILL flow runs a second broker of its own on the same
# database (docs/streams.md), so this broker is never interrupted.
echo "compat: Stream runtime with ${venv_2x##*/compat-venv-}"
# With the private cluster, its PostgreSQL restart flow too (an immediate shutdown mid-cycle).
pg_restart=()
if [ ${#pg_ctl_cmd[@]} -gt 0 ]; then
    pg_restart=(--pg-restart "${pg_ctl_cmd[*]} -D $tmp/pg -l $tmp/pg/server.log -m immediate -w restart")
fi
"$venv_2x/bin/python" "$root/tests/compat/streams26.py" "http://127.0.0.1:$port" \
    --broker "$target/release/queen-broker" "${pg_restart[@]}" || status=$?
if [ "$status" -ne 0 ]; then
    echo "compat: broker log (last 50 lines):" >&2
    tail -n 50 "$tmp/broker.log" >&2
fi
echo "compat: Queen's Python client over HTTPS (tests/compat/tls.sh)"
QUEEN_BROKER_BIN="$target/release/queen-broker" bash "$root/tests/compat/tls.sh" || status=$?
echo "compat: Kafka clients on the Kafka listener (tests/compat/kafka.sh)"
QUEEN_BROKER_BIN="$target/release/queen-broker" bash "$root/tests/compat/kafka.sh" || status=$?
echo "compat: kafkajs on the Kafka listener (tests/compat/kafkajs.sh)"
QUEEN_BROKER_BIN="$target/release/queen-broker" bash "$root/tests/compat/kafkajs.sh" || status=$?
exit "$status"
