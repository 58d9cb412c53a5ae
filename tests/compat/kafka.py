"""Kafka clients against the broker's Kafka listener (docs/kafka.md).

    python tests/compat/kafka.py HTTP_PORT KAFKA_PORT

Runs, with confluent-kafka (librdkafka) and kafka-python from PyPI:
- produce with keys and headers, once per compression codec (none, gzip, snappy, lz4, zstd),
  then read everything back in offset order with keys, headers and values intact;
- an idempotent producer (enable.idempotence);
- a consumer group that consumes and commits, closes, and a new consumer of the same group
  that resumes from the committed offset (nothing twice, nothing lost);
- cross-protocol: an HTTP push fetched over Kafka, a Kafka produce popped over HTTP;
- kafka-python: produce and consume in a group with commit.
Exits non-zero on the first failed check.
"""

import json
import os
import sys
import threading
import time
import urllib.request
import uuid

# This file is named kafka.py: keep its own folder off the path, so `import kafka` finds
# kafka-python and not this script.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

HTTP_PORT = int(sys.argv[1])
KAFKA_PORT = int(sys.argv[2])
BOOTSTRAP = f"127.0.0.1:{KAFKA_PORT}"
HTTP = f"http://127.0.0.1:{HTTP_PORT}"

failures = 0


def check(cond, what):
    global failures
    if cond:
        print(f"kafka: ok   {what}")
    else:
        failures += 1
        print(f"kafka: FAIL {what}")


def http(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(HTTP + path, data=data, method=method,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as res:
        raw = res.read()
        return res.status, (json.loads(raw) if raw else None)


def topic(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def confluent_flows():
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    t = topic("codecs")
    fs = admin.create_topics([NewTopic(t, num_partitions=3, replication_factor=1)])
    fs[t].result(timeout=10)
    md = admin.list_topics(timeout=10)
    check(t in md.topics and len(md.topics[t].partitions) == 3, "CreateTopics: 3 partitions in metadata")

    sent = []
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"]:
        p = Producer({"bootstrap.servers": BOOTSTRAP, "compression.type": codec,
                      "linger.ms": 5, "acks": "all"})
        reports = []
        for i in range(20):
            key = f"{codec}-{i % 3}".encode()
            value = (f"{codec} value {i} " + "x" * 50).encode()
            headers = [("codec", codec.encode()), ("n", str(i).encode())]
            p.produce(t, key=key, value=value, headers=headers, partition=i % 3,
                      on_delivery=lambda err, msg: reports.append((err, msg.offset())))
            sent.append((i % 3, key, value, headers))
        p.flush(10)
        check(len(reports) == 20 and all(e is None for e, _ in reports),
              f"produce {codec}: 20 delivery reports without error")
        check(all(o is not None and o >= 0 for _, o in reports), f"produce {codec}: offsets reported")

    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": topic("reader"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(t, i, 0) for i in range(3)])
    got = []
    deadline = time.time() + 20
    while len(got) < len(sent) and time.time() < deadline:
        m = c.poll(1.0)
        if m is None or m.error():
            continue
        got.append((m.partition(), m.key(), m.value(), m.headers() or [], m.offset()))
    c.close()
    check(len(got) == len(sent), f"consume: {len(got)} of {len(sent)} records")
    for part in range(3):
        want = [(k, v, h) for (p, k, v, h) in sent if p == part]
        have = [(k, v, h) for (p, k, v, h, _) in got if p == part]
        check(have == want, f"partition {part}: keys, values, headers intact and in order")
        offsets = [o for (p, _, _, _, o) in got if p == part]
        check(offsets == list(range(len(offsets))), f"partition {part}: offsets 0..{len(offsets)-1}")

    # Idempotent producer.
    t2 = topic("idem")
    p = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True})
    reports = []
    for i in range(50):
        p.produce(t2, value=json.dumps({"n": i}).encode(),
                  on_delivery=lambda err, msg: reports.append(err))
    p.flush(10)
    check(len(reports) == 50 and all(e is None for e in reports), "idempotent producer: 50 delivered")

    # Group consume with commit, then resume from the committed offset.
    t3 = topic("group")
    p = Producer({"bootstrap.servers": BOOTSTRAP})
    for i in range(30):
        p.produce(t3, value=json.dumps({"n": i}).encode())
    p.flush(10)
    group = topic("g")

    def consumer():
        return Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})

    c = consumer()
    c.subscribe([t3])
    first = []
    deadline = time.time() + 30
    while len(first) < 10 and time.time() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        first.append(json.loads(m.value())["n"])
        if len(first) == 10:
            c.commit(message=m, asynchronous=False)
    c.close()
    check(first == list(range(10)), "group: first consumer read 0..9 and committed")
    c = consumer()
    c.subscribe([t3])
    rest = []
    deadline = time.time() + 30
    while len(rest) < 20 and time.time() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        rest.append(json.loads(m.value())["n"])
    committed = c.committed([TopicPartition(t3, 0)], timeout=10)
    c.close()
    check(rest == list(range(10, 30)), f"group: second consumer resumed at 10 (got {rest[:3]}...)")
    check(committed[0].offset == 10, f"group: committed offset is 10 ({committed[0].offset})")

    # A rebalance between two members: every record once per group, in order per partition.
    t6 = topic("rebalance")
    admin.create_topics([NewTopic(t6, num_partitions=4, replication_factor=1)])[t6].result(10)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5})
    for i in range(200):
        p.produce(t6, key=str(i).encode(), value=json.dumps({"n": i}).encode(), partition=i % 4)
    p.flush(10)
    group6 = topic("rb")
    seen = {}
    lock = threading.Lock()
    stop = threading.Event()

    def member(name, delay):
        time.sleep(delay)
        c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": group6,
                      "auto.offset.reset": "earliest", "enable.auto.commit": False,
                      "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                      "partition.assignment.strategy": "cooperative-sticky"})
        c.subscribe([t6])
        pending = None  # a commit refused during a rebalance, tried again before the next poll
        while not stop.is_set():
            if pending is not None:
                try:
                    c.commit(offsets=[pending], asynchronous=False)
                    pending = None
                except KafkaException:
                    time.sleep(0.1)
                    continue
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            with lock:
                seen.setdefault(m.partition(), []).append((json.loads(m.value())["n"], name))
            try:
                c.commit(message=m, asynchronous=False)
            except KafkaException:
                pending = TopicPartition(t6, m.partition(), m.offset() + 1)
            time.sleep(0.01)  # slow enough that the second member joins mid-way
        c.close()

    threads = [threading.Thread(target=member, args=("a", 0)),
               threading.Thread(target=member, args=("b", 1.0))]
    for th in threads:
        th.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        with lock:
            if sum(len(v) for v in seen.values()) >= 200:
                break
        time.sleep(0.2)
    time.sleep(1.0)  # anything delivered twice would show now
    listed = admin.list_consumer_groups().result(10)
    check(group6 in [g.group_id for g in listed.valid], "ListGroups: the group is listed")
    described = admin.describe_consumer_groups([group6])[group6].result(10)
    check(len(described.members) == 2, f"DescribeGroups: two members ({len(described.members)})")
    stop.set()
    for th in threads:
        th.join(20)
    all_n = sorted(n for v in seen.values() for n, _ in v)
    check(all_n == list(range(200)), f"rebalance: 200 records once each ({len(all_n)} seen)")
    check(all([n for n, _ in seen.get(part, [])] == list(range(part, 200, 4)) for part in range(4)),
          "rebalance: in offset order per partition")
    members = {who for v in seen.values() for _, who in v}
    check(members == {"a", "b"}, f"rebalance: both members consumed ({sorted(members)})")

    # Cross-protocol: HTTP push → Kafka fetch.
    t4 = topic("cross")
    status, _ = http("POST", "/api/v1/push", {"items": [
        {"queue": t4, "partition": "0", "payload": {"from": "http", "n": i}} for i in range(5)]})
    check(status in (200, 201), "cross: HTTP push accepted")
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": topic("x"),
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(t4, 0, 0)])
    seen = []
    deadline = time.time() + 20
    while len(seen) < 5 and time.time() < deadline:
        m = c.poll(1.0)
        if m is None or m.error():
            continue
        seen.append(json.loads(m.value()))
    c.close()
    check(seen == [{"from": "http", "n": i} for i in range(5)], "cross: HTTP push fetched over Kafka")

    # Cross-protocol: Kafka produce → HTTP pop.
    t5 = topic("cross")
    p = Producer({"bootstrap.servers": BOOTSTRAP})
    for i in range(3):
        p.produce(t5, value=json.dumps({"from": "kafka", "n": i}).encode(), partition=0)
    p.produce(t5, key=b"k1", value=b"not json", partition=0, headers=[("h", b"v")])
    p.flush(10)
    status, body = http("GET", f"/api/v1/pop/queue/{t5}/partition/0?batch=10&wait=false")
    msgs = (body or {}).get("messages", []) if isinstance(body, dict) else []
    datas = [m.get("data") for m in msgs]
    check(datas[:3] == [{"from": "kafka", "n": i} for i in range(3)],
          f"cross: Kafka JSON values popped over HTTP as JSON ({datas[:3]})")
    check(len(datas) == 4 and datas[3] == {"kafka": {"timestamp": datas[3]["kafka"]["timestamp"],
          "key": "k1", "value": "not json", "headers": [["h", "v"]]}},
          f"cross: a keyed non-JSON record popped as its envelope ({datas[3:]})")


def kafka_python_flows():
    from kafka import KafkaConsumer, KafkaProducer

    t = topic("kp")
    p = KafkaProducer(bootstrap_servers=BOOTSTRAP, acks="all")
    for i in range(10):
        p.send(t, key=f"k{i}".encode(), value=json.dumps({"n": i}).encode(),
               headers=[("i", str(i).encode())])
    p.flush(10)
    p.close()
    group = topic("kpg")
    c = KafkaConsumer(t, bootstrap_servers=BOOTSTRAP, group_id=group,
                      auto_offset_reset="earliest", enable_auto_commit=False,
                      consumer_timeout_ms=15000)
    got = []
    for m in c:
        got.append((m.key, json.loads(m.value)["n"], dict(m.headers)["i"]))
        if len(got) == 10:
            break
    c.commit()
    c.close()
    check(got == [(f"k{i}".encode(), i, str(i).encode()) for i in range(10)],
          "kafka-python: produce and group consume with keys and headers")
    c = KafkaConsumer(t, bootstrap_servers=BOOTSTRAP, group_id=group,
                      auto_offset_reset="earliest", enable_auto_commit=False,
                      consumer_timeout_ms=3000)
    again = [m for m in c]
    c.close()
    check(again == [], "kafka-python: a committed group reads nothing again")


confluent_flows()
kafka_python_flows()
if failures:
    print(f"kafka: {failures} check(s) failed")
    sys.exit(1)
print("kafka: all checks passed")
