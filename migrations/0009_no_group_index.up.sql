-- No index of the consumer rows leads with the group any more. `partition_consumers_group
-- (consumer_group, queue_id)` matched `consumer_group = $2` in every statement of the consume
-- path, and on a table PostgreSQL has not analyzed yet (a new database, its first minute) the
-- planner took it over the primary key for `partition_id = $1 AND consumer_group = $2`: each
-- claim and ack walked every row of the group instead of probing one. What it served (deleting
-- a group's rows, an admin action) reads the table once instead.
DROP INDEX IF EXISTS queen.partition_consumers_group;
