-- Removes the streams runtime's tables (registered queries and all their state are lost).
DROP TABLE IF EXISTS queen.stream_state;
DROP TABLE IF EXISTS queen.stream_shards;
DROP TABLE IF EXISTS queen.stream_queries;
