-- Removes consumer state, dead letters and the partitions' write marker.
DROP TABLE IF EXISTS queen.dead_letters;
DROP TABLE IF EXISTS queen.partition_consumers;
DROP TABLE IF EXISTS queen.consumer_subscriptions;
DROP INDEX IF EXISTS queen.partitions_write_order;
ALTER TABLE queen.partitions DROP COLUMN IF EXISTS last_write_xid;
