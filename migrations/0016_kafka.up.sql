-- The Kafka front door (src/kafka, docs/kafka.md). A topic is a queue and Kafka partition i is
-- the queue's partition named "i"; what Kafka needs beyond that is a topic's partition count
-- (set by CreateTopics or on auto-create; a queue made over HTTP has none and counts its
-- numbered partitions) and producer ids for idempotent producers, unique across brokers.
-- Committed offsets of Kafka consumer groups are the groups' cursors in partition_consumers.
CREATE TABLE queen.kafka_topics (
    queue_id   BIGINT PRIMARY KEY REFERENCES queen.queues (id) ON DELETE CASCADE,
    partitions INTEGER NOT NULL CHECK (partitions > 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE SEQUENCE queen.kafka_producer_ids;
