-- Messages deleted one by one (`DELETE /api/v1/messages/{partitionId}/{transactionId}`).
-- Segments never change once committed (every broker may cache them), so a deleted message
-- stays in its segment and is recorded here instead: the claim statements read the offsets
-- deleted inside the range they lease (an index probe, empty for almost every partition) and
-- the pop leaves those messages out; the message routes hide them. The rows go with their
-- partition.
CREATE TABLE queen.deleted_messages (
    partition_id BIGINT NOT NULL REFERENCES queen.partitions (id) ON DELETE CASCADE,
    msg_offset   BIGINT NOT NULL,
    deleted_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (partition_id, msg_offset)
);
