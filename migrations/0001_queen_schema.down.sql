-- Drops everything the broker stores.
DROP SCHEMA IF EXISTS queen CASCADE;
