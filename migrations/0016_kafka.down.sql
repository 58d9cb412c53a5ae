-- Removes the Kafka front door's tables (topic partition counts, producer ids); the queues,
-- their messages and the groups' cursors stay.
DROP SEQUENCE IF EXISTS queen.kafka_producer_ids;
DROP TABLE IF EXISTS queen.kafka_topics;
