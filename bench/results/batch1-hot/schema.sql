CREATE TABLE parts (
    id BIGSERIAL PRIMARY KEY, uuid UUID NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    queue_id BIGINT NOT NULL, name VARCHAR(255) NOT NULL, next_offset BIGINT NOT NULL DEFAULT 0,
    last_write_at TIMESTAMPTZ, created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_write_xid BIGINT NOT NULL DEFAULT 0, UNIQUE (queue_id, name));
CREATE INDEX parts_wo ON parts (queue_id, last_write_xid, id);
CREATE INDEX parts_ch ON parts (queue_id, last_write_at, id);
INSERT INTO parts (queue_id, name) SELECT 1, 'p'||g FROM generate_series(1,100) g;
CREATE TABLE segs (partition_id BIGINT NOT NULL, base_offset BIGINT NOT NULL, msg_count INT NOT NULL,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(), frames BYTEA NOT NULL, PRIMARY KEY (partition_id, base_offset));
CREATE TABLE keys (partition_id BIGINT NOT NULL, key_hash BIGINT NOT NULL, msg_offset BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now());
CREATE INDEX keys_probe ON keys (partition_id, key_hash);
