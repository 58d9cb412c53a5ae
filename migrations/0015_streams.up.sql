-- The streams runtime of the 2.x SDKs (reference 2.x §2.11, docs/streams.md): registered
-- queries, and the state rows their operators keep per (query, source partition). A cycle
-- writes state, sink pushes and the source ack in one transaction; the shard row below is what
-- serialises the cycles of one (query, partition), on every broker.

-- One row per registered query, found by its user-chosen name. `config_hash` is opaque (the
-- SDK's hash of its operator chain); a different hash is refused unless the register resets.
-- The two limits bound the state one (query, partition) may hold (413 past them); their
-- defaults are documented in docs/streams.md and an operator may change them per query.
CREATE TABLE queen.stream_queries (
    id              uuid PRIMARY KEY,
    name            text COLLATE "C" NOT NULL UNIQUE,
    source_queue    text NOT NULL,
    sink_queue      text,
    config_hash     text NOT NULL,
    max_state_keys  bigint NOT NULL DEFAULT 250000,
    max_state_bytes bigint NOT NULL DEFAULT 67108864,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- One row per (query, partition) that ever ran a cycle: the row a cycle locks first (FOR
-- UPDATE through its upsert), and the running size of that partition's state, so the bound is
-- checked without counting rows. The partition is the source partition's public id (no foreign
-- key: state outlives nothing, a reset or the query's deletion removes it).
CREATE TABLE queen.stream_shards (
    query_id     uuid NOT NULL,
    partition_id uuid NOT NULL,
    state_keys   bigint NOT NULL DEFAULT 0,
    state_bytes  bigint NOT NULL DEFAULT 0,
    cycles       bigint NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, partition_id)
);

-- The state rows. `value` is the JSON text exactly as received (never jsonb); `window_end` is
-- its top-level `windowEnd` when that is a number, extracted at write time, so the idle flush's
-- "windows ripe before T" is one range scan of `stream_state_ripe` however many keys the
-- partition holds. Keys sort bytewise (COLLATE "C"): a key prefix is one range of the key.
CREATE TABLE queen.stream_state (
    query_id     uuid NOT NULL,
    partition_id uuid NOT NULL,
    key          text COLLATE "C" NOT NULL,
    value        text NOT NULL,
    window_end   double precision,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, partition_id, key)
);

CREATE INDEX stream_state_ripe
    ON queen.stream_state (query_id, partition_id, window_end)
 WHERE window_end IS NOT NULL;
