"""Kafka clients against the broker's Kafka listener (docs/kafka.md).

    python tests/compat/kafka.py HTTP_PORT KAFKA_PORT
    python tests/compat/kafka.py two-brokers KAFKA_PORT KAFKA_PORT_2 PID_1

Runs, with confluent-kafka (librdkafka) and kafka-python from PyPI:
- produce with keys and headers, once per compression codec (none, gzip, snappy, lz4, zstd),
  then read everything back in offset order with keys, headers and values intact;
- an idempotent producer (enable.idempotence);
- a consumer group that consumes and commits, closes, and a new consumer of the same group
  that resumes from the committed offset (nothing twice, nothing lost);
- cross-protocol: an HTTP push fetched over Kafka, a Kafka produce popped over HTTP;
- kafka-python: produce and consume in a group with commit.
With `two-brokers` (two brokers on one database, docs/kafka.md "Several brokers"; the first one's
process id last, as this script kills it):
- Metadata on each broker lists both; the group's coordinator is the broker asked first;
- kafka-python: two consumers of one group, each bootstrapped to a different broker;
- confluent-kafka: two consumers of one group, each bootstrapped to a different broker, consume
  a topic of 4 partitions with a commit per record and a rebalance: every record committed once,
  in offset order per partition; then one leaves, the coordinator's broker is killed (SIGKILL),
  and the remaining consumer finishes from the committed offsets once the other broker took
  the group (the time it took is printed).
Exits non-zero when a check failed.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

# This file is named kafka.py: keep its own folder off the path, so `import kafka` finds
# kafka-python and not this script.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

TWO_BROKERS = len(sys.argv) > 1 and sys.argv[1] == "two-brokers"
if TWO_BROKERS:
    KAFKA_PORT, KAFKA_PORT_2, PID_1 = (int(a) for a in sys.argv[2:5])
    BOOTSTRAP_2 = f"127.0.0.1:{KAFKA_PORT_2}"
else:
    HTTP_PORT = int(sys.argv[1])
    KAFKA_PORT = int(sys.argv[2])
    HTTP = f"http://127.0.0.1:{HTTP_PORT}"
BOOTSTRAP = f"127.0.0.1:{KAFKA_PORT}"

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


def in_order_once(seen, records, partitions):
    """Whether `seen` ({partition: [n, ...]}) holds each of `records` (n on partition n % partitions)
    once, in offset order per partition."""
    return all(seen.get(p, []) == [n for n in records if n % partitions == p]
               for p in range(partitions))


def two_brokers_kafka_python():
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewTopic as KpNewTopic

    t = topic("kp-two")
    admin = KafkaAdminClient(bootstrap_servers=BOOTSTRAP)
    admin.create_topics([KpNewTopic(t, num_partitions=2, replication_factor=1)])
    admin.close()
    group = topic("kp-two-g")
    seen, by, assignments = {}, set(), {}
    lock = threading.Lock()
    stop_file = os.path.join(tempfile.mkdtemp(), "stop")

    # Each consumer in a process of its own, as two applications would run them, polling for up
    # to 1 s: with 200 ms polls kafka-python 3.0.12's group leader now and then (about 1 run in
    # 4, in one process or two) receives its SyncGroup answer and never applies it (no
    # assignment, no heartbeats; the coordinator drops it after the session timeout).
    def member(who, bootstrap):
        child = subprocess.Popen([sys.executable, "-c", KP_MEMBER, bootstrap, t, group, stop_file],
                                 stdout=subprocess.PIPE, text=True)
        for line in child.stdout:
            event = json.loads(line)
            with lock:
                if "assigned" in event:
                    assignments[who] = set(event["assigned"])
                else:
                    seen.setdefault(event["p"], []).append(event["n"])
                    by.add(who)
        child.wait(20)

    threads = [threading.Thread(target=member, args=(who, b))
               for who, b in ((0, BOOTSTRAP), (1, BOOTSTRAP_2))]
    for th in threads:
        th.start()

    def split():
        with lock:
            return sorted(len(assignments.get(w, ())) for w in (0, 1)) == [1, 1]

    deadline = time.time() + 60
    while not split() and time.time() < deadline:
        time.sleep(0.1)
    check(split(), f"kafka-python, two brokers: each consumer of the group got one of the 2 "
                   f"partitions ({assignments})")
    p = KafkaProducer(bootstrap_servers=BOOTSTRAP_2)
    for i in range(40):
        p.send(t, value=json.dumps({"n": i}).encode(), partition=i % 2)
    p.flush(10)
    p.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        with lock:
            if sum(len(v) for v in seen.values()) >= 40:
                break
        time.sleep(0.1)
    time.sleep(1.0)
    open(stop_file, "w").close()
    for th in threads:
        th.join(30)
    check(in_order_once(seen, range(40), 2) and by == {0, 1},
          f"kafka-python, two brokers: 40 records once each, in order, by both consumers "
          f"({sum(len(v) for v in seen.values())} seen, by {sorted(by)})")


# One kafka-python group member: prints its assignment when it changes and each record it
# reads (one JSON object a line), commits after each batch, and leaves once the stop file exists.
KP_MEMBER = """
import json, os, sys
sys.path = [p for p in sys.path if p not in ("", ".")]
from kafka import KafkaConsumer
bootstrap, topic, group, stop_file = sys.argv[1:5]
c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                  auto_offset_reset="earliest", enable_auto_commit=False,
                  session_timeout_ms=6000, heartbeat_interval_ms=500)
assigned = None
while not os.path.exists(stop_file):
    batch = c.poll(timeout_ms=1000)
    now = sorted(tp.partition for tp in c.assignment())
    if now != assigned:
        assigned = now
        print(json.dumps({"assigned": now}), flush=True)
    for tp, msgs in batch.items():
        for m in msgs:
            print(json.dumps({"p": tp.partition, "n": json.loads(m.value)["n"]}), flush=True)
    if batch:
        c.commit()
c.close()
"""


def two_brokers_failover():
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    admin_2 = AdminClient({"bootstrap.servers": BOOTSTRAP_2})
    deadline = time.time() + 15
    while time.time() < deadline:
        ports = [sorted(b.port for b in a.list_topics(timeout=10).brokers.values())
                 for a in (admin, admin_2)]
        if ports == [sorted([KAFKA_PORT, KAFKA_PORT_2])] * 2:
            break
        time.sleep(0.5)
    check(ports == [sorted([KAFKA_PORT, KAFKA_PORT_2])] * 2,
          f"Metadata on each broker lists both ({ports})")

    two_brokers_kafka_python()

    parts, first, later = 4, 200, 100
    t = topic("two")
    admin.create_topics([NewTopic(t, num_partitions=parts, replication_factor=1)])[t].result(10)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "linger.ms": 5})
    for i in range(first):
        p.produce(t, value=json.dumps({"n": i}).encode(), partition=i % parts)
    p.flush(10)
    group = topic("two-g")
    seen = {}          # partition -> [n, ...] of the records whose commit succeeded
    who = {}           # member -> records it committed
    events = []        # (member, "assign" | "revoke" | "lost", partitions)
    assigned = {}      # member -> its partitions now
    commits_after_kill = []
    killed_at = []
    lock = threading.Lock()
    stop = {"a": threading.Event(), "b": threading.Event()}
    hold = threading.Event()   # set: members poll nothing (no commit in flight at the kill)
    idle = {"a": threading.Event(), "b": threading.Event()}

    def member(name, bootstrap, delay):
        time.sleep(delay)
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                      "auto.offset.reset": "earliest", "enable.auto.commit": False,
                      "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                      "partition.assignment.strategy": "cooperative-sticky"})

        def changed(kind):
            def cb(consumer, tps):
                with lock:
                    events.append((name, kind, sorted(tp.partition for tp in tps)))
                    now = set(assigned.get(name, set()))
                    now = now | {tp.partition for tp in tps} if kind == "assign" else \
                        now - {tp.partition for tp in tps}
                    assigned[name] = now
            return cb

        c.subscribe([t], on_assign=changed("assign"), on_revoke=changed("revoke"),
                    on_lost=changed("lost"))
        while not stop[name].is_set():
            if hold.is_set():
                idle[name].set()
                time.sleep(0.05)
                continue
            idle[name].clear()
            m = c.poll(0.2)
            if m is None or m.error():
                continue
            try:
                c.commit(message=m, asynchronous=False)
            except KafkaException:
                # Not committed: read it again (its owner, whoever that is next, starts at
                # the committed offset; this member goes back to it meanwhile).
                try:
                    c.seek(TopicPartition(t, m.partition(), m.offset()))
                except KafkaException:
                    pass
                time.sleep(0.1)
                continue
            with lock:
                seen.setdefault(m.partition(), []).append(json.loads(m.value())["n"])
                who[name] = who.get(name, 0) + 1
                if killed_at:
                    commits_after_kill.append(time.time())
            time.sleep(0.01)  # slow enough that the second member joins mid-way
        c.close()

    def committed_count():
        with lock:
            return sum(len(v) for v in seen.values())

    threads = {"a": threading.Thread(target=member, args=("a", BOOTSTRAP, 0)),
               "b": threading.Thread(target=member, args=("b", BOOTSTRAP_2, 1.0))}
    for th in threads.values():
        th.start()
    deadline = time.time() + 90
    while committed_count() < first and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # anything delivered twice would show now
    described = admin_2.describe_consumer_groups([group])[group].result(10)
    check(len(described.members) == 2 and described.coordinator.port == KAFKA_PORT,
          f"two members; asked through the second broker, the coordinator is the first "
          f"({len(described.members)} members, coordinator port {described.coordinator.port})")
    with lock:
        check(in_order_once(seen, range(first), parts),
              f"two brokers: {first} records committed once each, in order per partition "
              f"({sum(len(v) for v in seen.values())} committed)")
        check(who.get("a", 0) > 0 and who.get("b", 0) > 0,
              f"two brokers: both consumers committed records ({who})")
        check(any(e[0] == "a" and e[1] == "revoke" for e in events),
              f"two brokers: the first consumer handed partitions over when the second joined "
              f"({events})")

    # The first consumer leaves; the second gets every partition.
    stop["a"].set()
    threads["a"].join(20)
    deadline = time.time() + 30
    while time.time() < deadline:
        with lock:
            if assigned.get("b") == set(range(parts)):
                break
        time.sleep(0.1)
    with lock:
        check(assigned.get("b") == set(range(parts)),
              f"after the first consumer left the second holds every partition ({assigned.get('b')})")

    # The coordinator's broker dies; the remaining consumer goes on through the other one.
    hold.set()
    idle["b"].wait(10)
    os.kill(PID_1, signal.SIGKILL)
    killed = time.time()
    with lock:
        killed_at.append(killed)
    hold.clear()
    p = Producer({"bootstrap.servers": BOOTSTRAP_2, "linger.ms": 5})
    for i in range(first, first + later):
        p.produce(t, value=json.dumps({"n": i}).encode(), partition=i % parts)
    p.flush(10)
    deadline = time.time() + 120
    while committed_count() < first + later and time.time() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    stop["b"].set()
    threads["b"].join(30)
    with lock:
        resumed = commits_after_kill[0] - killed if commits_after_kill else None
        check(in_order_once(seen, range(first + later), parts),
              f"after the kill: {first + later} records committed once each, in order per "
              f"partition ({sum(len(v) for v in seen.values())} committed)")
        print(f"kafka: failover: first commit {resumed and round(resumed, 1)} s after the "
              f"coordinator's broker was killed; {len(events)} assignment changes "
              f"({sum(1 for e in events if e[1] == 'lost')} lost): {events}")
    described = admin_2.describe_consumer_groups([group])[group].result(10)
    check(described.coordinator.port == KAFKA_PORT_2,
          f"the second broker coordinates the group now (port {described.coordinator.port})")
    c = Consumer({"bootstrap.servers": BOOTSTRAP_2, "group.id": group})
    committed = c.committed([TopicPartition(t, i) for i in range(parts)], timeout=10)
    c.close()
    want = (first + later) // parts
    check([tp.offset for tp in committed] == [want] * parts,
          f"committed offsets at the end: {[tp.offset for tp in committed]}")


if TWO_BROKERS:
    two_brokers_failover()
else:
    confluent_flows()
    kafka_python_flows()
if failures:
    print(f"kafka: {failures} check(s) failed")
    sys.exit(1)
print("kafka: all checks passed")
