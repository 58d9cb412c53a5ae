-- Back to the placeholder of migrations/0003_admin: no consumer state, completed retention
-- removes nothing.
CREATE INDEX IF NOT EXISTS dead_letters_partition ON queen.dead_letters (partition_id);
DROP INDEX IF EXISTS queen.dead_letters_partition_offset;
CREATE OR REPLACE VIEW queen.partition_consumed AS
SELECT id AS partition_id,
       NULL::BIGINT AS consumed_below
  FROM queen.partitions
 WHERE FALSE;
DROP VIEW IF EXISTS queen.partition_group_progress;
