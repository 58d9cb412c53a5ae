-- Lag at scale (docs/operations.md, "Lag at scale"): when the subscribed (group, partition)
-- pairs are too many to measure on request, one broker at a time walks every partition in
-- chunks in the background (src/lag.rs) and leaves its result here; the views then read these
-- tables, whose size is that of the (queue, group) pairs and of a bounded list, never that of
-- the partitions. Each pass replaces the rows of the one before.

-- Per (queue, group): live leases, partitions with something unconsumed, messages past the
-- group's cursors and the arrival of the oldest of them, as the pass found them.
CREATE TABLE queen.lag_totals (
    consumer_group       VARCHAR(255) NOT NULL,
    queue_id             BIGINT NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    members              BIGINT NOT NULL,
    partitions_with_lag  BIGINT NOT NULL,
    backlog              BIGINT NOT NULL,
    oldest_unconsumed_at TIMESTAMPTZ,
    PRIMARY KEY (consumer_group, queue_id)
);
CREATE INDEX lag_totals_backlog ON queen.lag_totals (backlog DESC);

-- The (group, partition) pairs whose oldest unconsumed message is the oldest, at most 10 000
-- (what `GET /api/v1/consumer-groups/lagging` can ask for), as the pass found them.
CREATE TABLE queen.lag_oldest (
    consumer_group       VARCHAR(255) NOT NULL,
    partition_id         BIGINT NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    offset_lag           BIGINT NOT NULL,
    oldest_unconsumed_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (consumer_group, partition_id)
);
CREATE INDEX lag_oldest_age ON queen.lag_oldest (oldest_unconsumed_at);

-- The last pass: when it ran, what it read, and the spread (average, median, minimum,
-- maximum) of the lag of the pairs with something unconsumed, in seconds and in messages.
CREATE TABLE queen.lag_pass (
    only_row    BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
    started_at  TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ NOT NULL,
    partitions  BIGINT NOT NULL,
    pairs       BIGINT NOT NULL,
    time_avg    FLOAT8 NOT NULL,
    time_median FLOAT8 NOT NULL,
    time_min    FLOAT8 NOT NULL,
    time_max    FLOAT8 NOT NULL,
    offset_avg    FLOAT8 NOT NULL,
    offset_median FLOAT8 NOT NULL,
    offset_min    FLOAT8 NOT NULL,
    offset_max    FLOAT8 NOT NULL
);
