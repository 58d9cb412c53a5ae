-- Undoes 0014: the changed-partitions index and the ephemeral queues' configuration.
DROP TABLE IF EXISTS queen.ephemeral_queues;
DROP INDEX IF EXISTS queen.partitions_changed;
