"""Kafka clients with SASL against a broker with JWT_ENABLED=true (docs/kafka.md, "Authentication").

    python tests/compat/kafka_sasl.py HTTP_PORT KAFKA_PORT SECRET

Tokens are HS256 JWTs signed with SECRET (the broker's JWT_SECRET), minted here. With
confluent-kafka (librdkafka):
- SASL PLAIN with the token as the password: produce, then consume in a group with a commit;
- SASL OAUTHBEARER with the token handed out by `oauth_cb`: produce and consume in a group;
- a wrong token is refused (an authentication error, nothing delivered);
- a write-only token produces but its consumer gets an authorization error;
- a short-lived OAUTHBEARER token: librdkafka refreshes it through `oauth_cb` and
  re-authenticates (KIP-368), so a producer keeps producing past the first token's expiry;
- what was produced over SASL is popped over HTTP with a bearer token.
Exits non-zero when a check fails.
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.request
import uuid

# Keep this folder off the path (its kafka.py would shadow kafka-python).
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

from confluent_kafka import Consumer, KafkaError, Producer  # noqa: E402

HTTP_PORT = int(sys.argv[1])
KAFKA_PORT = int(sys.argv[2])
SECRET = sys.argv[3].encode()
BOOTSTRAP = f"127.0.0.1:{KAFKA_PORT}"
HTTP = f"http://127.0.0.1:{HTTP_PORT}"

failures = 0


def check(cond, what):
    global failures
    if cond:
        print(f"kafka-sasl: ok   {what}")
    else:
        failures += 1
        print(f"kafka-sasl: FAIL {what}")


def b64url(raw):
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def token(role, sub="kafka-compat", ttl=300, secret=SECRET):
    """An HS256 JWT with `sub`, `role` and an `exp` `ttl` seconds ahead."""
    now = int(time.time())
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = b64url(json.dumps({"sub": sub, "role": role, "iat": now, "exp": now + ttl}).encode())
    signature = hmac.new(secret, f"{header}.{claims}".encode(), hashlib.sha256).digest()
    return f"{header}.{claims}.{b64url(signature)}"


def topic(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def plain(jwt):
    return {"bootstrap.servers": BOOTSTRAP, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN", "sasl.username": "kafka-compat", "sasl.password": jwt}


def oauth(mint):
    """OAUTHBEARER with tokens from `mint()` -> (jwt, exp seconds)."""
    def oauth_cb(_config):
        jwt, exp = mint()
        return jwt, float(exp), "kafka-compat"
    return {"bootstrap.servers": BOOTSTRAP, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "OAUTHBEARER", "oauth_cb": oauth_cb}


def produce(conf, t, n, start=0):
    """Produces n JSON records; the delivery errors (None for each success)."""
    p = Producer({**conf, "acks": "all", "linger.ms": 5, "message.timeout.ms": 15000})
    reports = []
    for i in range(start, start + n):
        p.produce(t, value=json.dumps({"n": i}).encode(),
                  on_delivery=lambda err, msg: reports.append(err))
        p.poll(0)
    p.flush(20)
    return reports


def consume_group(conf, t, n, group):
    """Consumes n records in a group, commits; the values' n and the errors seen."""
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": 6000})
    c.subscribe([t])
    got, errors = [], []
    deadline = time.time() + 30
    while len(got) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            errors.append(m.error())
            if m.error().fatal() or m.error().code() in (
                    KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED,
                    KafkaError._AUTHENTICATION):
                break
            continue
        got.append(json.loads(m.value())["n"])
        if len(got) == n:
            c.commit(message=m, asynchronous=False)
    c.close()
    return got, errors


def main():
    rw = token("read-write")

    # PLAIN: produce, consume in a group with a commit.
    t = topic("sasl-plain")
    reports = produce(plain(rw), t, 20)
    check(len(reports) == 20 and all(e is None for e in reports),
          "PLAIN (token as password): 20 records delivered")
    got, errors = consume_group(plain(rw), t, 20, topic("g"))
    check(got == list(range(20)), f"PLAIN: a group consumed them in order ({len(got)}; {errors[:1]})")

    # OAUTHBEARER through oauth_cb.
    t2 = topic("sasl-oauth")
    mint = lambda: (rw, time.time() + 300)  # noqa: E731
    reports = produce(oauth(mint), t2, 20)
    check(len(reports) == 20 and all(e is None for e in reports),
          "OAUTHBEARER (oauth_cb): 20 records delivered")
    got, errors = consume_group(oauth(mint), t2, 20, topic("g"))
    check(got == list(range(20)), f"OAUTHBEARER: a group consumed them in order ({len(got)}; {errors[:1]})")

    # A token signed with another secret: authentication fails, nothing is delivered.
    forged = token("admin", secret=b"not-the-broker-secret-at-all-32-bytes")
    errors = []
    # (log_level 0: librdkafka would log each refused reconnect on stderr.)
    p = Producer({**plain(forged), "message.timeout.ms": 5000, "log_level": 0,
                  "error_cb": lambda e: errors.append(e)})
    reports = []
    p.produce(topic("forged"), value=b"{}", on_delivery=lambda err, msg: reports.append(err))
    p.flush(10)
    del p
    check(reports and reports[0] is not None, f"a forged token delivers nothing ({reports[:1]})")
    check(any(e.code() == KafkaError._AUTHENTICATION for e in errors),
          f"a forged token is an authentication error ({errors[:1]})")

    # write-only: may produce, may not consume.
    t3 = topic("sasl-writer")
    wo = token("write-only")
    reports = produce(plain(wo), t3, 5)
    check(len(reports) == 5 and all(e is None for e in reports), "write-only token: produce delivered")
    got, errors = consume_group(plain(wo), t3, 5, topic("g"))
    check(not got and any(e.code() in (KafkaError.GROUP_AUTHORIZATION_FAILED,
                                       KafkaError.TOPIC_AUTHORIZATION_FAILED) for e in errors),
          f"write-only token: consuming is refused with an authorization error ({errors[:1]})")

    # A short-lived token: librdkafka refreshes it (oauth_cb) and re-authenticates (KIP-368).
    # 8 s: librdkafka 2.0.2 starts re-authenticating at 90 % of the session lifetime, and with a
    # 4 s token that 0.4 s margin was sometimes too short for a connection busy producing (a
    # request slipped past the expiry and, as on a Kafka broker, closed the connection).
    t4 = topic("sasl-reauth")
    minted = []

    def short():
        minted.append(time.time())
        return token("read-write", ttl=8), int(time.time()) + 8
    p = Producer({**oauth(short), "acks": "all", "message.timeout.ms": 15000})
    reports = []
    deadline = time.time() + 18
    i = 0
    while time.time() < deadline:
        p.produce(t4, value=json.dumps({"n": i}).encode(),
                  on_delivery=lambda err, msg: reports.append(err))
        i += 1
        p.poll(0.25)
    p.flush(20)
    check(len(minted) >= 2, f"short-lived token: oauth_cb was asked {len(minted)} times")
    check(reports and all(e is None for e in reports),
          f"short-lived token: {len(reports)} records over 18 s delivered, "
          f"{sum(e is not None for e in reports)} failed")

    # What PLAIN produced is popped over HTTP with the same kind of token.
    req = urllib.request.Request(f"{HTTP}/api/v1/pop/queue/{t}/partition/0?wait=false&batch=5",
                                 headers={"authorization": f"Bearer {rw}"})
    with urllib.request.urlopen(req, timeout=30) as res:
        body = json.loads(res.read() or b"{}")
    messages = body.get("messages", []) if isinstance(body, dict) else []
    check(len(messages) == 5, f"HTTP pop with a bearer token: {len(messages)} of 5 popped")


main()
sys.exit(1 if failures else 0)
