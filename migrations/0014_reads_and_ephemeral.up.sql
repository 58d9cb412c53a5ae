-- Reads without a lease and ephemeral queues (docs/reads-and-ephemeral.md).
--
-- `POST /api/v1/partitions/changed` lists a queue's partitions written at or after a time, in
-- creation order, and is polled: `partitions_changed` serves "this queue, written since T"
-- as one index range scan whose size is the number of partitions written since T (the page
-- is then ordered by id, which is creation order). The listing without a time walks the
-- primary key from the page cursor.
CREATE INDEX IF NOT EXISTS partitions_changed ON queen.partitions (queue_id, last_write_at, id);

-- The declared configuration of ephemeral queues. Their contents live in one broker's memory
-- and survive nothing; what was declared comes back after a restart, empty.
CREATE TABLE IF NOT EXISTS queen.ephemeral_queues (
    name       VARCHAR(255) PRIMARY KEY,
    options    JSONB NOT NULL DEFAULT '{}'::jsonb,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
