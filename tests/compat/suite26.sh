#!/usr/bin/env bash
# Runs the own test suite of Queen's 2.x Python client (the queen-mq 2.6.0 sdist from PyPI, its
# tests/ folder, 116 tests) against this broker, as a user of that client would: one fresh
# database and one fresh broker per test file (the suite's queue and key names are fixed, so it
# expects a broker that has never seen them), the broker with an encryption key set.
#
# Which files run is tests/compat/suite26/files.txt (one file a line); the tests of those files
# that this broker does not pass yet are listed, with the reason, in suite26/deselect.txt and left
# out. Everything else must pass: the script exits non-zero on any failure.
#
#   bash tests/compat/suite26.sh                      # the listed files
#   bash tests/compat/suite26.sh test_kv.py ...       # only these files (nothing deselected)
#   QUEEN_BROKER_BIN=path/to/queen-broker bash tests/compat/suite26.sh   # another binary
#   SUITE26_CLIENT_OPTS=binary_push,push_compression bash tests/compat/suite26.sh test_push.py
#                                                     # the client's opt-in wire formats (conftest.py)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/support/private-pg.sh
source "$root/tests/support/private-pg.sh"
target=${CARGO_TARGET_DIR:-$root/target}
python=${PYTHON:-python3}
broker_bin=${QUEEN_BROKER_BIN:-$target/release/queen-broker}
here=$root/tests/compat/suite26

tmp=$(mktemp -d -t queen-suite26-XXXXXX)
broker_pid=""
cleanup() {
    if [ -n "$broker_pid" ]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
    stop_private_pg
    rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "${QUEEN_BROKER_BIN:-}" ]; then
    echo "suite26: building the release broker"
    (cd "$root" && cargo build --release --quiet --bin queen-broker)
fi

venv=$target/compat-venv-2.6.0
echo "suite26: installing tests/compat/requirements-2.6.txt into $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/tests/compat/requirements-2.6.txt"
pinned=$(grep -o 'queen-mq==[0-9.]*' "$root/tests/compat/requirements-2.6.txt")
"$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    --dest "$tmp/sdist" "$pinned"
tar -xzf "$tmp"/sdist/queen_mq-*.tar.gz -C "$tmp"
suite=$(ls -d "$tmp"/queen_mq-*/tests)
cp "$here/conftest.py" "$suite/conftest.py"

start_private_pg suite26

if [ $# -gt 0 ]; then
    files=("$@")
    deselect=()
else
    mapfile -t files < <(grep -v -E '^\s*(#|$)' "$here/files.txt")
    mapfile -t deselect < <(grep -v -E '^\s*(#|$)' "$here/deselect.txt" | sed -E 's/\s+#.*$//' | sed 's/^/--deselect=/')
fi

key=$("$venv/bin/python" -c 'import secrets; print(secrets.token_hex(32))')
status=0
for file in "${files[@]}"; do
    db="suite_$(basename "$file" .py)"
    "$psql_bin" -q -h 127.0.0.1 -p "$pg_port" -U postgres -d postgres -c "CREATE DATABASE \"$db\"" >/dev/null
    port=$(free_port)
    mkdir -p "$tmp/spool-$db"
    DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/$db" HOST=127.0.0.1 PORT=$port \
        FILE_BUFFER_DIR="$tmp/spool-$db" LOG_LEVEL=${LOG_LEVEL:-warn} QUEEN_CONFIG="" \
        QUEEN_ENCRYPTION_KEY=$key "$broker_bin" >"$tmp/broker-$db.log" 2>&1 &
    broker_pid=$!
    for _ in $(seq 300); do
        curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        sleep 0.1
    done
    echo "suite26: $file${SUITE26_CLIENT_OPTS:+ (client: $SUITE26_CLIENT_OPTS)}"
    if ! (cd "$suite/.." && QUEEN_URL="http://127.0.0.1:$port" QUEEN_SERVER_URL="http://127.0.0.1:$port" "$venv/bin/python" -m pytest -q \
        -p no:cacheprovider "${deselect[@]}" "tests/$file"); then
        status=1
        echo "suite26: $file failed; broker log (last 30 lines):" >&2
        tail -n 30 "$tmp/broker-$db.log" >&2
    fi
    kill "$broker_pid" 2>/dev/null || true
    wait "$broker_pid" 2>/dev/null || true
    broker_pid=""
done
exit "$status"
