-- Kafka consumer groups across brokers (src/kafka/cluster.rs, docs/kafka.md "Several brokers").
-- Every broker with a Kafka listener registers here under a node id of its own with the address
-- clients reach it at, and keeps its row alive with a lease it renews; the brokers whose lease
-- is running are the Kafka cluster that Metadata lists. Each consumer group is coordinated by
-- the one broker holding the group's lease: FindCoordinator claims an unowned or expired group,
-- the owner renews while it holds the group in memory, and another broker takes the group only
-- once the lease ran out. Leases are read and set on PostgreSQL's clock (now()), never a
-- broker's. A broker's row going (a clean stop, or long expired) releases its groups.
CREATE SEQUENCE queen.kafka_node_ids AS integer MINVALUE 0 START 0;
CREATE TABLE queen.kafka_brokers (
    node_id     INTEGER PRIMARY KEY,
    host        TEXT NOT NULL,
    port        INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until TIMESTAMPTZ NOT NULL
);
CREATE INDEX kafka_brokers_address ON queen.kafka_brokers (host, port);
CREATE TABLE queen.kafka_coordinators (
    group_id    TEXT PRIMARY KEY,
    node_id     INTEGER NOT NULL REFERENCES queen.kafka_brokers (node_id) ON DELETE CASCADE,
    claimed_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_until TIMESTAMPTZ NOT NULL
);
CREATE INDEX kafka_coordinators_node ON queen.kafka_coordinators (node_id);
