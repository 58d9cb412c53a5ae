-- Removes the key/value store (and with it every lock and semaphore permit).
DROP TABLE IF EXISTS queen.kv;
DROP SEQUENCE IF EXISTS queen.kv_versions;
