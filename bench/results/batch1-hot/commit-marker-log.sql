\set p1 random(1,100)
\set p2 random(1,100)
\set p3 random(1,100)
\set p4 random(1,100)
BEGIN;
SELECT id, next_offset FROM parts WHERE id = ANY(ARRAY[:p1,:p2,:p3,:p4]::int8[]) ORDER BY id FOR UPDATE;
SELECT 1 FROM keys WHERE partition_id = ANY(ARRAY[:p1,:p2,:p3,:p4]::int8[]) AND key_hash = :p1 * 7919;
WITH moved AS (UPDATE parts SET next_offset = next_offset + 1, last_write_at = now(), last_write_xid = pg_current_xact_id()::text::int8 WHERE id = ANY(ARRAY[:p1,:p2,:p3,:p4]::int8[]) RETURNING id, next_offset),
 s AS (INSERT INTO segs SELECT id, next_offset, 1, now(), decode(repeat('ab', 150), 'hex') FROM moved)
, k AS (INSERT INTO keys SELECT id, (random()*1e15)::int8, next_offset FROM moved) INSERT INTO wlog SELECT 1, pg_current_xact_id()::text::int8, id FROM moved;
COMMIT;
