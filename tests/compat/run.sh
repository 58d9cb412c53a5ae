#!/usr/bin/env bash
# Runs Queen's official Python client (queen-mq) against the release broker, once per pinned
# version (requirements.txt: 1.3.0; requirements-0.15.txt: 0.15.0): makes a virtual environment
# per version, installs the client, starts the broker on a free port against DATABASE_URL (or a
# private PostgreSQL cluster in a temp dir when unset) with a fresh QUEEN_ENCRYPTION_KEY, runs
# compat.py with each client, and exits non-zero when a flow fails. QUEEN_COMPAT_STRICT=1 also
# fails on flows skipped because the broker lacks a route they need.
#
#   bash tests/compat/run.sh                 # from the repository root, nothing else needed
#   DATABASE_URL=postgres://... bash tests/compat/run.sh
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
python=${PYTHON:-python3}
requirements=("$root/tests/compat/requirements.txt" "$root/tests/compat/requirements-0.15.txt")

tmp=$(mktemp -d -t queen-compat-XXXXXX)
broker_pid=""
pg_ctl_cmd=()
cleanup() {
    if [ -n "$broker_pid" ]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
    if [ ${#pg_ctl_cmd[@]} -gt 0 ]; then "${pg_ctl_cmd[@]}" -D "$tmp/pg" -m immediate stop >/dev/null 2>&1 || true; fi
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
venv=${venvs[0]}

free_port() { "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

if [ -z "${DATABASE_URL:-}" ]; then
    pg_ctl_path=$(command -v pg_ctl || ls -d /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -n 1 || true)
    [ -n "$pg_ctl_path" ] || { echo "compat: no pg_ctl found; install PostgreSQL or set DATABASE_URL" >&2; exit 2; }
    pgbin=$(dirname "$pg_ctl_path")
    as_pg=()
    if [ "$(id -u)" = 0 ]; then  # PostgreSQL refuses to run as root
        as_pg=(runuser -u postgres --)
        chown postgres "$tmp"
    fi
    pg_port=$(free_port)
    "${as_pg[@]}" "$pgbin/initdb" -D "$tmp/pg" -U postgres --auth=trust >"$tmp/initdb.log" 2>&1 \
        || { cat "$tmp/initdb.log" >&2; exit 2; }
    pg_ctl_cmd=("${as_pg[@]}" "$pgbin/pg_ctl")
    "${pg_ctl_cmd[@]}" -D "$tmp/pg" -l "$tmp/pg/server.log" -w \
        -o "-p $pg_port -k $tmp -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
    export DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
    echo "compat: private PostgreSQL on port $pg_port"
fi

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
if [ "$status" -ne 0 ]; then
    echo "compat: broker log (last 50 lines):" >&2
    tail -n 50 "$tmp/broker.log" >&2
fi
exit "$status"
