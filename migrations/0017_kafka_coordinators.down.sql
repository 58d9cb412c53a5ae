-- Removes the Kafka brokers' registry and the groups' coordinator leases (membership itself was
-- only ever in the brokers' memory; committed offsets stay in partition_consumers).
DROP TABLE IF EXISTS queen.kafka_coordinators;
DROP TABLE IF EXISTS queen.kafka_brokers;
DROP SEQUENCE IF EXISTS queen.kafka_node_ids;
