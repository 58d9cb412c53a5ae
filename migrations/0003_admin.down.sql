-- Drops the consumer-state view that retention reads.
DROP VIEW IF EXISTS queen.partition_consumed;
