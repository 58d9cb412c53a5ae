// kafkajs (the pure JavaScript Kafka client) against the broker's Kafka listener
// (docs/kafka.md), run by tests/compat/kafkajs.sh with KAFKA_BROKERS and HTTP_BASE set:
// CreateTopics; an idempotent producer with keys and headers, uncompressed and gzip; a group of
// two members that commit each record before the next, with a rebalance when the second joins;
// every record exactly once for the group, in offset order per partition; a restart from the
// committed offsets reads only what came after; a record produced over Kafka popped over HTTP.
// Exits non-zero on the first failed check.
import { Kafka, CompressionTypes, logLevel } from "kafkajs";
import assert from "node:assert/strict";

const brokers = (process.env.KAFKA_BROKERS || "").split(",").filter(Boolean);
const httpBase = process.env.HTTP_BASE;
assert.ok(brokers.length > 0 && httpBase, "KAFKA_BROKERS and HTTP_BASE must be set");

const topic = "kafkajs-orders";
const group = "kafkajs-group";
const partitions = 3;
const kafka = new Kafka({ clientId: "queen-compat", brokers, logLevel: logLevel.WARN });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(what, check, ms = 60_000) {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms`);
    await sleep(50);
  }
}

// A record's identity as the consumer saw it.
const seen = [];
function member(name) {
  const consumer = kafka.consumer({ groupId: group, sessionTimeout: 10_000, heartbeatInterval: 1_000 });
  let assigned = [];
  consumer.on(consumer.events.GROUP_JOIN, (e) => {
    assigned = Object.values(e.payload.memberAssignment).flat();
  });
  return {
    consumer,
    assigned: () => assigned,
    async start() {
      await consumer.connect();
      await consumer.subscribe({ topic, fromBeginning: true });
      await consumer.run({
        autoCommit: false,
        eachMessage: async ({ topic: t, partition, message }) => {
          seen.push({
            member: name,
            partition,
            offset: Number(message.offset),
            key: message.key?.toString(),
            value: message.value?.toString(),
            header: message.headers?.h?.toString(),
          });
          // Committed before the next record: a rebalance hands on exactly what is left.
          await consumer.commitOffsets([{ topic: t, partition, offset: String(Number(message.offset) + 1) }]);
          await sleep(20);
        },
      });
    },
  };
}

async function produce(producer, from, to, compression) {
  const messages = [];
  for (let i = from; i < to; i++) {
    messages.push({ key: `k${i}`, value: JSON.stringify({ n: i }), partition: i % partitions, headers: { h: `v${i}` } });
  }
  await producer.send({ topic, compression, messages });
}

const admin = kafka.admin();
await admin.connect();
const created = await admin.createTopics({ topics: [{ topic, numPartitions: partitions }], waitForLeaders: true });
assert.equal(created, true, "the topic is created");
const meta = await admin.fetchTopicMetadata({ topics: [topic] });
assert.equal(meta.topics[0].partitions.length, partitions, "its partition count");

const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
await producer.connect();
await produce(producer, 0, 30, CompressionTypes.None);
await produce(producer, 30, 60, CompressionTypes.GZIP);
const offsets = await admin.fetchTopicOffsets(topic);
assert.equal(offsets.reduce((n, p) => n + Number(p.high), 0), 60, "60 records stored");

// One member first; the second joins while the first is reading, and the group rebalances.
const a = member("a");
await a.start();
await until("the first member reads", () => seen.length >= 10);
const b = member("b");
await b.start();
await until("every record read", () => seen.length >= 60, 90_000);
await until("the second member is assigned partitions", () => b.assigned().length > 0, 30_000);
await sleep(1_000);
assert.equal(seen.length, 60, `each record once for the group, got ${seen.length}`);
const byPartition = new Map();
for (const r of seen) {
  const list = byPartition.get(r.partition) || [];
  list.push(r.offset);
  byPartition.set(r.partition, list);
  const n = Number(r.key.slice(1));
  assert.equal(r.value, JSON.stringify({ n }), "value kept");
  assert.equal(r.header, `v${n}`, "header kept");
  assert.equal(r.partition, n % partitions, "the partition it was sent to");
}
for (const [p, list] of byPartition) {
  assert.deepEqual(list, [...list].sort((x, y) => x - y), `offset order in partition ${p}`);
  assert.deepEqual(list, list.map((_, i) => i), `no gap or repeat in partition ${p}`);
}
const members = new Set(seen.map((r) => r.member));
console.log(`kafkajs: 60 records, once each, by members ${[...members].join(", ")}; b assigned ${b.assigned().join(",")}`);
await a.consumer.disconnect();
await b.consumer.disconnect();

// A restart from the committed offsets reads only what came after.
await produce(producer, 60, 66, CompressionTypes.GZIP);
seen.length = 0;
const c = member("c");
await c.start();
await until("the new records", () => seen.length >= 6);
await sleep(1_500);
assert.deepEqual(seen.map((r) => r.key).sort(), ["k60", "k61", "k62", "k63", "k64", "k65"], "resumed after the commits");
await c.consumer.disconnect();
await producer.disconnect();
await admin.disconnect();

// The same records over HTTP.
const popped = await fetch(`${httpBase}/api/v1/pop/queue/${topic}/partition/0?batch=1&wait=false&consumerGroup=http-view`);
assert.equal(popped.status, 200, "popped over HTTP");
const body = await popped.json();
const data = body.messages[0].data;
assert.equal(data.kafka.key, "k0", `an envelope with the key: ${JSON.stringify(data)}`);
assert.deepEqual(data.kafka.json, { n: 0 });
console.log("kafkajs: ok");
process.exit(0);
