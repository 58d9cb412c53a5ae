-- Message traces (reference §9.4, `POST /api/v1/traces`): events a consumer records about a
-- message, optionally filed under names that link messages of one workflow. A trace names its
-- message by (partition, transactionId) and keeps the message id found when it was recorded;
-- deleting the partition (its queue) deletes its traces. `data` is JSON text, like payloads.
CREATE TABLE queen.message_traces (
    id             UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    partition_id   BIGINT NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    transaction_id TEXT NOT NULL,
    message_id     UUID NOT NULL,
    consumer_group VARCHAR(255) NOT NULL,
    event_type     VARCHAR(255) NOT NULL,
    data           TEXT NOT NULL,
    worker_id      TEXT,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX message_traces_message ON queen.message_traces (partition_id, transaction_id, created_at);

CREATE TABLE queen.message_trace_names (
    trace_id   UUID NOT NULL REFERENCES queen.message_traces (id) ON DELETE CASCADE,
    trace_name VARCHAR(255) NOT NULL,
    PRIMARY KEY (trace_id, trace_name)
);
CREATE INDEX message_trace_names_name ON queen.message_trace_names (trace_name);
