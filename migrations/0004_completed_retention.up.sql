-- Completed retention reads real consumer state (docs/operations.md, "Retention").
--
-- The groups of a partition are the groups subscribed to its queue (`consumer_subscriptions`,
-- recorded on a group's first pop on the queue; queue mode `__QUEUE_MODE__` is a group like any
-- other) plus any group with a consumer row on the partition (a partition seek creates one
-- without a subscription). Per (partition, group), everything below `consumed_below` is
-- consumed: the row's `committed_offset`, or 0 when the group has no row for the partition yet
-- (it has consumed nothing of it, whatever its subscription mode: the row is what records where
-- a `new` or timestamp subscription starts on a partition, so until the group has touched the
-- partition nothing of it counts as consumed).
--
-- One definition, read by completed retention (through `partition_consumed`) and by the
-- message counts and statuses of the admin routes (src/storage/progress.rs).
CREATE VIEW queen.partition_group_progress AS
SELECT p.id AS partition_id,
       s.consumer_group,
       COALESCE(c.committed_offset, 0) AS consumed_below
  FROM queen.partitions p
  JOIN queen.consumer_subscriptions s ON s.queue_id = p.queue_id
  LEFT JOIN queen.partition_consumers c
    ON c.partition_id = p.id AND c.consumer_group = s.consumer_group
UNION ALL
SELECT c.partition_id,
       c.consumer_group,
       c.committed_offset AS consumed_below
  FROM queen.partition_consumers c
 WHERE NOT EXISTS (SELECT 1
                     FROM queen.consumer_subscriptions s
                    WHERE s.queue_id = c.queue_id
                      AND s.consumer_group = c.consumer_group);

-- Replaces the placeholder of migrations/0003_admin (same two columns): per partition, the
-- offset below which every group of the partition has consumed everything. A partition without
-- any group has consumed nothing (0). Completed retention removes only whole segments below it.
CREATE OR REPLACE VIEW queen.partition_consumed AS
SELECT p.id AS partition_id,
       COALESCE((SELECT min(g.consumed_below)
                   FROM queen.partition_group_progress g
                  WHERE g.partition_id = p.id), 0)::BIGINT AS consumed_below
  FROM queen.partitions p;

-- Message statuses look dead letters up by (partition, offset); this index also serves what
-- the partition-only one did (the cascade from partitions), so it replaces it.
CREATE INDEX dead_letters_partition_offset ON queen.dead_letters (partition_id, msg_offset);
DROP INDEX queen.dead_letters_partition;
