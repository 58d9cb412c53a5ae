-- The broker's storage model (docs/architecture.md): queues and their options, partitions whose
-- row is the write lock and the offset allocator, segments holding many messages per row, and
-- the dedup sidecar probed under the partition lock. Payloads are never jsonb: frames keep the
-- bytes exactly as received.
CREATE SCHEMA IF NOT EXISTS queen;

CREATE TABLE queen.queues (
    id                          BIGSERIAL PRIMARY KEY,
    uuid                        UUID NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    name                        VARCHAR(255) NOT NULL UNIQUE,
    namespace                   VARCHAR(255) NOT NULL DEFAULT '',
    task                        VARCHAR(255) NOT NULL DEFAULT '',
    priority                    INTEGER NOT NULL DEFAULT 0,
    lease_time                  INTEGER NOT NULL DEFAULT 300,
    retry_limit                 INTEGER NOT NULL DEFAULT 3,
    retry_delay                 INTEGER NOT NULL DEFAULT 1000,
    max_size                    BIGINT NOT NULL DEFAULT 0,
    ttl                         INTEGER NOT NULL DEFAULT 3600,
    dead_letter_queue           BOOLEAN NOT NULL DEFAULT FALSE,
    dlq_after_max_retries       BOOLEAN NOT NULL DEFAULT FALSE,
    delayed_processing          INTEGER NOT NULL DEFAULT 0,
    window_buffer               INTEGER NOT NULL DEFAULT 0,
    retention_enabled           BOOLEAN NOT NULL DEFAULT FALSE,
    retention_seconds           INTEGER NOT NULL DEFAULT 0,
    completed_retention_seconds INTEGER NOT NULL DEFAULT 0,
    max_wait_time_seconds       INTEGER NOT NULL DEFAULT 0,
    encryption_enabled          BOOLEAN NOT NULL DEFAULT FALSE,
    dedup_window_seconds        INTEGER NOT NULL DEFAULT 3600 CHECK (dedup_window_seconds >= 0),
    created_at                  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- One row per partition. `next_offset` is the next offset to hand out; the row lock taken in
-- the commit transaction serialises every writer of the partition, on every broker.
CREATE TABLE queen.partitions (
    id            BIGSERIAL PRIMARY KEY,
    uuid          UUID NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    queue_id      BIGINT NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name          VARCHAR(255) NOT NULL,
    next_offset   BIGINT NOT NULL DEFAULT 0,
    last_write_at TIMESTAMPTZ,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (queue_id, name)
);

-- One row per committed write of one partition: messages base_offset .. base_offset+msg_count-1,
-- encoded as frames (see src/storage/frames.rs). Rows never change once written.
CREATE TABLE queen.segments (
    partition_id BIGINT NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    base_offset  BIGINT NOT NULL,
    msg_count    INTEGER NOT NULL CHECK (msg_count > 0),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    frames       BYTEA NOT NULL,
    PRIMARY KEY (partition_id, base_offset)
);
CREATE INDEX segments_created_at_brin ON queen.segments USING BRIN (created_at);

-- The dedup sidecar: one narrow row per message of a queue with dedup on. No foreign key (it
-- would cost a lookup per row on the hot path); rows of a deleted partition are swept.
CREATE TABLE queen.dedup_keys (
    partition_id BIGINT NOT NULL,
    key_hash     BIGINT NOT NULL,
    msg_offset   BIGINT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX dedup_keys_probe ON queen.dedup_keys (partition_id, key_hash);
-- Rows arrive in time order, so a BRIN index serves the expiry sweep for almost nothing.
CREATE INDEX dedup_keys_created_at_brin ON queen.dedup_keys USING BRIN (created_at);

-- Key/value state shared by every broker on the database (maintenance flags).
CREATE TABLE queen.system_state (
    key        TEXT PRIMARY KEY,
    value      JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
