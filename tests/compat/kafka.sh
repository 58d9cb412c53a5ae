#!/usr/bin/env bash
# Kafka clients against the broker's Kafka listener (docs/kafka.md): starts the broker with
# QUEEN_KAFKA_PORT on free ports against DATABASE_URL (or a private PostgreSQL cluster in a temp
# dir when unset), then runs
# - kcat (Debian's package, librdkafka 2.0.2) when installed: -L, -P with keys, -C back;
# - tests/compat/kafka.py with confluent-kafka and kafka-python (requirements-kafka.txt): every
#   compression codec, keys and headers, an idempotent producer, a group that commits and
#   resumes, a rebalance between two members, HTTP push → Kafka fetch, Kafka produce → HTTP pop.
# Exits non-zero when a check fails. tests/compat/run.sh (so CI) runs it after tls.sh.
#
#   bash tests/compat/kafka.sh                                           # builds the release broker
#   QUEEN_BROKER_BIN=path/to/queen-broker bash tests/compat/kafka.sh     # another binary, no build
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/support/private-pg.sh
source "$root/tests/support/private-pg.sh"
target=${CARGO_TARGET_DIR:-$root/target}
python=${PYTHON:-python3}
broker_bin=${QUEEN_BROKER_BIN:-$target/release/queen-broker}

tmp=$(mktemp -d -t queen-compat-kafka-XXXXXX)
broker_pid=""
cleanup() {
    if [ -n "$broker_pid" ]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
    stop_private_pg
    rm -rf "$tmp"
}
trap cleanup EXIT

if [ -z "${QUEEN_BROKER_BIN:-}" ]; then
    echo "compat-kafka: building the release broker"
    (cd "$root" && cargo build --release --quiet --bin queen-broker)
fi

venv=$target/compat-venv-kafka
echo "compat-kafka: installing tests/compat/requirements-kafka.txt into $venv"
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$root/tests/compat/requirements-kafka.txt"

[ -n "${DATABASE_URL:-}" ] || start_private_pg compat-kafka

port=$(free_port)
kafka_port=$(free_port)
mkdir -p "$tmp/spool"
HOST=127.0.0.1 PORT=$port QUEEN_KAFKA_PORT=$kafka_port FILE_BUFFER_DIR="$tmp/spool" \
    LOG_LEVEL=${LOG_LEVEL:-warn} QUEEN_CONFIG="" \
    "$broker_bin" >"$tmp/broker.log" 2>&1 &
broker_pid=$!
"$venv/bin/python" - "$port" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/health"
for _ in range(300):
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
sys.exit("compat-kafka: the broker did not become healthy within 30 s")
PY
echo "compat-kafka: broker on port $port, Kafka on $kafka_port"

status=0
if command -v kcat >/dev/null; then
    bootstrap=127.0.0.1:$kafka_port
    topic=kcat-$RANDOM$RANDOM
    kcat -b "$bootstrap" -L | grep -q "broker 0 at 127.0.0.1:$kafka_port" \
        && echo "compat-kafka: ok   kcat -L lists this broker" \
        || { echo "compat-kafka: FAIL kcat -L"; status=1; }
    printf 'k1:{"n":1}\nk2:plain text\nk3:{"n":3}\n' | kcat -b "$bootstrap" -P -t "$topic" -K: \
        && echo "compat-kafka: ok   kcat -P produced 3 keyed records" \
        || { echo "compat-kafka: FAIL kcat -P"; status=1; }
    got=$(kcat -b "$bootstrap" -C -t "$topic" -o beginning -e -q -f '%o %k %s\n')
    want=$'0 k1 {"n":1}\n1 k2 plain text\n2 k3 {"n":3}'
    if [ "$got" = "$want" ]; then
        echo "compat-kafka: ok   kcat -C read them back in order with their keys"
    else
        echo "compat-kafka: FAIL kcat -C got: $got"; status=1
    fi
else
    echo "compat-kafka: kcat not installed (apt-get install kcat); its checks are skipped"
fi

# Request arrays declaring billions of elements: the codec reserves room for the declared count
# (docs/kafka.md, "Hostile input"); the release binary's allocator reserves it lazily, and the
# connection is closed when the bytes run out. The broker must still serve afterwards.
"$venv/bin/python" - "$port" "$kafka_port" <<'PY' || status=$?
import socket, struct, sys, time, urllib.request
http_port, kafka_port = int(sys.argv[1]), int(sys.argv[2])
classic = struct.pack(">hhih", 3, 4, 1, 2) + b"it" + struct.pack(">i", 0x7FFFFFFF) + b"\x00\x01a"
flexible = (struct.pack(">hhih", 1, 12, 2, 2) + b"it\x00" + struct.pack(">iiiibii", -1, 100, 1, 1000, 0, 0, -1)
            + b"\xff\xff\xff\xff\x0f\x00")
for name, frame in [("classic", classic), ("flexible", flexible)]:
    s = socket.create_connection(("127.0.0.1", kafka_port))
    s.sendall(struct.pack(">i", len(frame)) + frame)
    s.settimeout(10)
    closed = s.recv(16) == b""
    print(f"compat-kafka: {'ok  ' if closed else 'FAIL'} a {name} array of 2^31+ elements closes its connection")
    if not closed:
        sys.exit(1)
with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=5) as r:
    ok = r.status == 200
print(f"compat-kafka: {'ok  ' if ok else 'FAIL'} the broker still serves after them")
sys.exit(0 if ok else 1)
PY
"$venv/bin/python" "$root/tests/compat/kafka.py" "$port" "$kafka_port" || status=$?
if [ "$status" -ne 0 ]; then
    echo "compat-kafka: broker log (last 50 lines):" >&2
    tail -n 50 "$tmp/broker.log" >&2
fi
exit "$status"
