-- Consuming (docs/architecture.md, "Consuming"): per (partition, consumer group) a committed
-- offset and the current lease; per (queue, group) the subscription chosen on first contact and
-- the scan watermark of the queue-level pop; dead letters; and the write marker on partitions
-- that lets a queue-level pop find partitions written since its last look through an index
-- instead of scanning every partition.

-- The transaction id (xid8, as bigint) of the commit that last wrote the partition. Unlike a
-- timestamp it can be compared with a snapshot's xmin, so a scan knows exactly which writes it
-- may have missed (those with an id >= xmin) and never skips one.
ALTER TABLE queen.partitions ADD COLUMN last_write_xid BIGINT NOT NULL DEFAULT 0;
CREATE INDEX partitions_write_order ON queen.partitions (queue_id, last_write_xid, id);

-- One row per (queue, group) that ever popped from the queue. `subscription_from` is where a
-- partition the group has no cursor for yet starts (NULL: from the beginning). (scan_xid,
-- scan_pid) is the watermark: every partition with (last_write_xid, id) below it was examined
-- and had nothing to hand out, or is tracked by its consumer row's `attention_at`.
CREATE TABLE queen.consumer_subscriptions (
    consumer_group    VARCHAR(255) NOT NULL,
    queue_id          BIGINT NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    subscription_mode TEXT NOT NULL CHECK (subscription_mode IN ('all', 'new', 'timestamp')),
    subscription_from TIMESTAMPTZ,
    scan_xid          BIGINT NOT NULL DEFAULT 0,
    scan_pid          BIGINT NOT NULL DEFAULT 0,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, queue_id)
);
CREATE INDEX consumer_subscriptions_queue ON queen.consumer_subscriptions (queue_id);

-- One row per (partition, group) the group has touched. Offsets below `committed_offset` are
-- consumed. The lease is live while `lease_expires_at` > now(); a release sets it to NULL, so
-- a past value is a lease that ran out. `lease_id`, `leased_from` and `leased_to` (exclusive)
-- describe the last lease and stay after it ends, so an ack can find its message inside that
-- range. `attention_at`: when the queue-level pop must look at this row again (a release that
-- left messages behind, a delayed message's visibility); NULL otherwise.
CREATE TABLE queen.partition_consumers (
    partition_id      BIGINT NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    consumer_group    VARCHAR(255) NOT NULL,
    queue_id          BIGINT NOT NULL,
    committed_offset  BIGINT NOT NULL,
    lease_id          UUID,
    lease_owner       TEXT,
    lease_acquired_at TIMESTAMPTZ,
    lease_expires_at  TIMESTAMPTZ,
    leased_from       BIGINT,
    leased_to         BIGINT,
    batch_retry_count INTEGER NOT NULL DEFAULT 0,
    retry_lease_id    UUID,
    attention_at      TIMESTAMPTZ,
    last_consumed_at  TIMESTAMPTZ,
    total_consumed    BIGINT NOT NULL DEFAULT 0,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, consumer_group)
);
CREATE INDEX partition_consumers_attention
    ON queen.partition_consumers (queue_id, consumer_group, attention_at)
    WHERE attention_at IS NOT NULL;
-- Leases that may run out: the queue-level pop looks here for expired ones.
CREATE INDEX partition_consumers_expiry
    ON queen.partition_consumers (queue_id, consumer_group, lease_expires_at)
    WHERE lease_expires_at IS NOT NULL;
CREATE INDEX partition_consumers_lease ON queen.partition_consumers (lease_id);
CREATE INDEX partition_consumers_group ON queen.partition_consumers (consumer_group, queue_id);

-- Dead letters carry a copy of the message: retention may remove its segment later.
CREATE TABLE queen.dead_letters (
    id                 BIGSERIAL PRIMARY KEY,
    partition_id       BIGINT NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    consumer_group     VARCHAR(255) NOT NULL,
    msg_offset         BIGINT NOT NULL,
    message_id         UUID NOT NULL,
    transaction_id     TEXT NOT NULL,
    trace_id           TEXT,
    producer_sub       TEXT,
    payload            TEXT NOT NULL,
    message_created_at TIMESTAMPTZ NOT NULL,
    error_message      TEXT,
    retry_count        INTEGER NOT NULL,
    failed_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX dead_letters_failed_at ON queen.dead_letters (failed_at DESC, id DESC);
CREATE INDEX dead_letters_partition ON queen.dead_letters (partition_id);
