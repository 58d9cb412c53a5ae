#!/usr/bin/env bash
# Kafka clients against the broker's Kafka listener (docs/kafka.md): starts the broker with
# QUEEN_KAFKA_PORT on free ports against DATABASE_URL (or a private PostgreSQL cluster in a temp
# dir when unset), then runs
# - kcat (Debian's package, librdkafka 2.0.2) when installed: -L, -P with keys, -C back;
# - tests/compat/kafka.py with confluent-kafka and kafka-python (requirements-kafka.txt): every
#   compression codec, keys and headers, an idempotent producer, a group that commits and
#   resumes, a rebalance between two members, HTTP push → Kafka fetch, Kafka produce → HTTP pop;
# then a second plain broker on the same database, and tests/compat/kafka.py two-brokers: Metadata
# lists both, consumers of one group bootstrapped to different brokers (kafka-python;
# confluent-kafka with a rebalance), then the first broker (the group's coordinator) is killed
# and the remaining consumer finishes through the second from the committed offsets;
# then a broker with JWT_ENABLED=true (on a database of its own in the same server), where
# - kcat authenticates with SASL PLAIN (an HS256 token as the password): -L, -P, -C;
# - tests/compat/kafka_sasl.py: confluent-kafka with SASL PLAIN and with OAUTHBEARER (oauth_cb),
#   a forged token refused, a write-only token that may not consume, a short-lived token
#   refreshed and re-authenticated (KIP-368).
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
second_pid=""
auth_pid=""
cleanup() {
    if [ -n "$broker_pid" ]; then kill "$broker_pid" 2>/dev/null || true; wait "$broker_pid" 2>/dev/null || true; fi
    if [ -n "$second_pid" ]; then kill "$second_pid" 2>/dev/null || true; wait "$second_pid" 2>/dev/null || true; fi
    if [ -n "$auth_pid" ]; then kill "$auth_pid" 2>/dev/null || true; wait "$auth_pid" 2>/dev/null || true; fi
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
# wait_healthy PORT LOG: waits for the broker on PORT; when it does not answer, shows the end
# of its LOG (a port taken meanwhile, a start-up error) before failing.
wait_healthy() {
    "$venv/bin/python" - "$1" "$2" <<'PY'
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/health"
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            if r.status == 200:
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.1)
try:
    with open(sys.argv[2], errors="replace") as log:
        sys.stderr.write("".join(log.readlines()[-30:]))
except OSError as e:
    sys.stderr.write(f"(no broker log: {e})\n")
sys.exit(f"compat-kafka: the broker on port {sys.argv[1]} did not become healthy within 60 s")
PY
}
wait_healthy "$port" "$tmp/broker.log"
echo "compat-kafka: broker on port $port, Kafka on $kafka_port"

status=0
if command -v kcat >/dev/null; then
    bootstrap=127.0.0.1:$kafka_port
    topic=kcat-$RANDOM$RANDOM
    kcat -b "$bootstrap" -L | grep -qE "broker [0-9]+ at 127.0.0.1:$kafka_port" \
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

# A second broker on the same database: one Kafka cluster. kafka.py kills the first broker (the
# coordinator of its groups) with SIGKILL half-way; the second stops cleanly afterwards, which
# releases its registration and groups.
second_port=$(free_port)
second_kafka_port=$(free_port)
mkdir -p "$tmp/spool-second"
HOST=127.0.0.1 PORT=$second_port QUEEN_KAFKA_PORT=$second_kafka_port FILE_BUFFER_DIR="$tmp/spool-second" \
    LOG_LEVEL=${LOG_LEVEL:-info} QUEEN_CONFIG="" \
    "$broker_bin" >"$tmp/broker-second.log" 2>&1 &
second_pid=$!
wait_healthy "$second_port" "$tmp/broker-second.log"
echo "compat-kafka: second broker on port $second_port, Kafka on $second_kafka_port"
two_status=0
"$venv/bin/python" "$root/tests/compat/kafka.py" two-brokers "$kafka_port" "$second_kafka_port" "$broker_pid" \
    || two_status=$?
wait "$broker_pid" 2>/dev/null || true
broker_pid=""
kill "$second_pid" 2>/dev/null || true
wait "$second_pid" 2>/dev/null || true
second_pid=""
if grep -q "Kafka broker and its groups released" "$tmp/broker-second.log"; then
    echo "compat-kafka: ok   the second broker released its groups on a clean stop"
else
    echo "compat-kafka: FAIL the second broker did not release its groups on a clean stop"
    two_status=1
fi
if [ "$two_status" -ne 0 ]; then
    echo "compat-kafka: two brokers, logs (last 30 lines each):" >&2
    tail -n 30 "$tmp/broker.log" "$tmp/broker-second.log" >&2
    status=1
fi

# A broker with JWT auth on: the Kafka listener demands SASL. On a database of its own: brokers
# on one database form one Kafka cluster (docs/kafka.md, "Several brokers"), and one without
# auth must not be listed to these clients.
secret="compat-kafka-secret-$RANDOM$RANDOM-of-at-least-32-bytes"
db_base=${DATABASE_URL%%\?*}
sasl_url="${db_base%/*}/queen_kafka_sasl${DATABASE_URL#"$db_base"}"
"${psql_bin:-psql}" -X -q -v ON_ERROR_STOP=1 "$DATABASE_URL" \
    -c "DROP DATABASE IF EXISTS queen_kafka_sasl" -c "CREATE DATABASE queen_kafka_sasl"
auth_port=$(free_port)
auth_kafka_port=$(free_port)
mkdir -p "$tmp/spool-auth"
HOST=127.0.0.1 PORT=$auth_port QUEEN_KAFKA_PORT=$auth_kafka_port FILE_BUFFER_DIR="$tmp/spool-auth" \
    DATABASE_URL="$sasl_url" JWT_ENABLED=true JWT_SECRET="$secret" \
    LOG_LEVEL=${LOG_LEVEL:-warn} QUEEN_CONFIG="" \
    "$broker_bin" >"$tmp/broker-auth.log" 2>&1 &
auth_pid=$!
wait_healthy "$auth_port" "$tmp/broker-auth.log"
echo "compat-kafka: broker with JWT_ENABLED on port $auth_port, Kafka (SASL) on $auth_kafka_port"
auth_status=0
if command -v kcat >/dev/null; then
    bootstrap=127.0.0.1:$auth_kafka_port
    jwt=$("$venv/bin/python" - "$secret" <<'PY'
import base64, hashlib, hmac, json, sys, time
b64 = lambda raw: base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
now = int(time.time())
head = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
body = b64(json.dumps({"sub": "kcat", "role": "read-write", "iat": now, "exp": now + 600}).encode())
sig = hmac.new(sys.argv[1].encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
print(f"{head}.{body}.{b64(sig)}")
PY
)
    sasl=(-X security.protocol=SASL_PLAINTEXT -X sasl.mechanisms=PLAIN -X sasl.username=kcat -X "sasl.password=$jwt")
    topic=kcat-sasl-$RANDOM$RANDOM
    kcat -b "$bootstrap" "${sasl[@]}" -L | grep -qE "broker [0-9]+ at 127.0.0.1:$auth_kafka_port" \
        && echo "compat-kafka: ok   kcat SASL PLAIN -L lists this broker" \
        || { echo "compat-kafka: FAIL kcat SASL PLAIN -L"; auth_status=1; }
    printf 'k1:{"n":1}\nk2:plain text\n' | kcat -b "$bootstrap" "${sasl[@]}" -P -t "$topic" -K: \
        && echo "compat-kafka: ok   kcat SASL PLAIN -P produced 2 keyed records" \
        || { echo "compat-kafka: FAIL kcat SASL PLAIN -P"; auth_status=1; }
    got=$(kcat -b "$bootstrap" "${sasl[@]}" -C -t "$topic" -o beginning -e -q -f '%o %k %s\n')
    if [ "$got" = $'0 k1 {"n":1}\n1 k2 plain text' ]; then
        echo "compat-kafka: ok   kcat SASL PLAIN -C read them back"
    else
        echo "compat-kafka: FAIL kcat SASL PLAIN -C got: $got"; auth_status=1
    fi
    if timeout 20 kcat -b "$bootstrap" -X security.protocol=SASL_PLAINTEXT -X sasl.mechanisms=PLAIN \
        -X sasl.username=kcat -X sasl.password=not-a-token -L -m 5 >/dev/null 2>&1; then
        echo "compat-kafka: FAIL kcat with a password that is no token listed metadata"; auth_status=1
    else
        echo "compat-kafka: ok   kcat with a password that is no token is refused"
    fi
    if timeout 20 kcat -b "$bootstrap" -L -m 5 >/dev/null 2>&1; then
        echo "compat-kafka: FAIL kcat without SASL listed metadata"; auth_status=1
    else
        echo "compat-kafka: ok   kcat without SASL is refused"
    fi
fi
"$venv/bin/python" "$root/tests/compat/kafka_sasl.py" "$auth_port" "$auth_kafka_port" "$secret" || auth_status=$?
# The short-lived token's connections were re-authenticated (KIP-368), not cut at its expiry.
if grep -q "was not re-authenticated" "$tmp/broker-auth.log"; then
    echo "compat-kafka: FAIL a SASL session ended at its token's expiry: the client did not re-authenticate"
    auth_status=1
else
    echo "compat-kafka: ok   no SASL session was cut at its token's expiry (librdkafka re-authenticated)"
fi
if [ "$auth_status" -ne 0 ]; then
    echo "compat-kafka: broker with JWT_ENABLED, log (last 50 lines):" >&2
    tail -n 50 "$tmp/broker-auth.log" >&2
    status=1
fi
exit "$status"
