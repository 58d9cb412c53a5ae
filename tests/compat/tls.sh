#!/usr/bin/env bash
# Queen's official Python client (queen-mq 2.6.0, tests/compat/requirements-2.6.txt) against the
# broker over HTTPS: makes a throwaway CA and a broker certificate with openssl (the recipe of
# docs/operations.md, "TLS"), starts the broker with QUEEN_TLS_CERT_FILE and QUEEN_TLS_KEY_FILE
# on a free port against DATABASE_URL (or a private PostgreSQL cluster in a temp dir when unset),
# and runs tls.py: push, pop and ack trusting the CA through SSL_CERT_FILE, and a refusal
# without it. Exits non-zero when a flow fails. tests/compat/run.sh (so CI) runs it last.
#
#   bash tests/compat/tls.sh                                             # builds the release broker
#   QUEEN_BROKER_BIN=path/to/queen-broker bash tests/compat/tls.sh       # another binary, no build
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/support/private-pg.sh
source "$root/tests/support/private-pg.sh"
target=${CARGO_TARGET_DIR:-$root/target}
python=${PYTHON:-python3}
broker_bin=${QUEEN_BROKER_BIN:-$target/release/queen-broker}
command -v openssl >/dev/null || { echo "compat-tls: openssl is needed to make the test certificates" >&2; exit 2; }

tmp=$(mktemp -d -t queen-compat-tls-XXXXXX)
broker_pid=""
cleanup() {
    if [ -n "$broker_pid" ]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
    stop_private_pg
    rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "${QUEEN_BROKER_BIN:-}" ]; then
    echo "compat-tls: building the release broker"
    (cd "$root" && cargo build --release --quiet --bin queen-broker)
fi

venv=$target/compat-venv-2.6.0
echo "compat-tls: installing tests/compat/requirements-2.6.txt into $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/tests/compat/requirements-2.6.txt"

[ -n "${DATABASE_URL:-}" ] || start_private_pg compat-tls

# A CA, and the broker's key and certificate signed by it for the address the client uses: the
# commands of docs/operations.md ("TLS", "Making a certificate").
tls=$tmp/tls
mkdir -p "$tls"
(
    cd "$tls"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
        -subj "/CN=queen compat CA" -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
        -subj "/CN=127.0.0.1" -keyout key.pem -out broker.csr 2>/dev/null
    printf '%s\n' "subjectAltName = IP:127.0.0.1, DNS:localhost" "basicConstraints = critical, CA:FALSE" \
        "keyUsage = critical, digitalSignature" "extendedKeyUsage = serverAuth" \
        "subjectKeyIdentifier = hash" "authorityKeyIdentifier = keyid" >broker.ext
    openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
        -extfile broker.ext -out cert.pem 2>/dev/null
)

port=$(free_port)
mkdir -p "$tmp/spool"
HOST=127.0.0.1 PORT=$port FILE_BUFFER_DIR="$tmp/spool" LOG_LEVEL=${LOG_LEVEL:-warn} QUEEN_CONFIG="" \
    QUEEN_TLS_CERT_FILE="$tls/cert.pem" QUEEN_TLS_KEY_FILE="$tls/key.pem" \
    "$broker_bin" >"$tmp/broker.log" 2>&1 &
broker_pid=$!
SSL_CERT_FILE="$tls/ca.pem" "$venv/bin/python" - "$port" <<'PY'
import sys, time, httpx
url = f"https://127.0.0.1:{sys.argv[1]}/health"
for _ in range(300):
    try:
        if httpx.get(url, timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.1)
sys.exit("compat-tls: the broker did not become healthy over HTTPS within 30 s")
PY
echo "compat-tls: broker on https://127.0.0.1:$port"

status=0
SSL_CERT_FILE="$tls/ca.pem" "$venv/bin/python" "$root/tests/compat/tls.py" "https://127.0.0.1:$port" || status=$?
if [ "$status" -ne 0 ]; then
    echo "compat-tls: broker log (last 50 lines):" >&2
    tail -n 50 "$tmp/broker.log" >&2
fi
exit "$status"
