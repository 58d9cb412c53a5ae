-- What completed-retention needs from consumer state, behind one view so retention does not
-- depend on how cursors are stored: per partition, an offset below which every consumer group
-- of the partition has consumed everything. NULL (or no row) = unknown, and then
-- completedRetentionSeconds removes nothing from that partition.
--
-- Consumer cursors arrive with migrations/0002_consumers (another branch). Until then this view
-- has no rows and /configure refuses completedRetentionSeconds > 0. After the merge, a later
-- migration replaces it (CREATE OR REPLACE VIEW, same two columns) with the minimum committed
-- offset over all groups of each partition; docs/operations.md says how.
CREATE VIEW queen.partition_consumed AS
SELECT id AS partition_id,
       NULL::BIGINT AS consumed_below
  FROM queen.partitions
 WHERE FALSE;
