CREATE INDEX IF NOT EXISTS partition_consumers_group
    ON queen.partition_consumers (consumer_group, queue_id);
