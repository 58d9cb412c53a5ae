-- Segment frames are TOAST-compressed with LZ4 instead of pglz. A segment (about a hundred
-- messages, tens of kilobytes) is always large enough to be compressed, and pglz spent about a
-- sixth of the machine's CPU in a produce-and-consume run compressing payloads it could not
-- shrink (random data); LZ4 gives up on such data almost at once and compresses JSON payloads
-- several times faster than pglz. Only new segments are affected; stored ones keep their form
-- and both read back the same. A server built without LZ4 keeps pglz.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE queen.segments ALTER COLUMN frames SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported THEN
    RAISE NOTICE 'this PostgreSQL has no LZ4 support; segment frames stay compressed with pglz';
END
$$;
