-- The key/value store of the 2.x surface (KV, and locks and semaphores kept as KV rows).
-- One row per live or not-yet-swept key. Versions come from ONE sequence, so a key's version
-- rises strictly across deletes, expiry and every broker sharing the database (lock tokens are
-- versions). Expiry is a predicate in every statement (`expires_at > statement_timestamp()`);
-- the sweeper only tidies rows that are already dead. `key` sorts bytewise (COLLATE "C") so
-- a prefix is one range of the primary key and keyset paging follows code-point order.
-- `value` is the JSON value as received (text, never jsonb).
CREATE SEQUENCE IF NOT EXISTS queen.kv_versions AS bigint;

CREATE TABLE IF NOT EXISTS queen.kv (
    namespace  text COLLATE "C" NOT NULL,
    key        text COLLATE "C" NOT NULL,
    value      text NOT NULL,
    version    bigint NOT NULL,
    expires_at timestamptz,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (namespace, key)
);

-- The sweeper's walk: only rows that can expire.
CREATE INDEX IF NOT EXISTS kv_expires_at ON queen.kv (expires_at) WHERE expires_at IS NOT NULL;
