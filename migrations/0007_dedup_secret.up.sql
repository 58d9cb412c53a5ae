-- The per-database secret of the dedup sidecar's key hash (src/storage/dedup.rs).
--
-- The sidecar stores a 64-bit hash of each transactionId. Unkeyed, two keys with the same hash
-- can be crafted offline, and once the first one's segment is gone (retention, inside the
-- window) the second would be answered `duplicate` without being stored. The hash is SipHash-2-4
-- keyed with this secret, which never leaves the database and the brokers: without it a
-- collision cannot be computed, only stumbled on (see docs/operations.md, "Deduplication").
--
-- 32 bytes from two gen_random_uuid() calls (PostgreSQL's strong random source; 244 random
-- bits), made once per database. Sidecar rows written before this migration carry the old
-- unkeyed hash and no longer match: keys pushed within one dedup window before the upgrade are
-- not recognised as duplicates after it.
CREATE TABLE queen.dedup_secret (
    id          BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    secret      BYTEA NOT NULL CHECK (length(secret) = 32),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

INSERT INTO queen.dedup_secret (secret)
VALUES (decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex'));
