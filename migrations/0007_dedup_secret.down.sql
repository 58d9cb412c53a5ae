DROP TABLE IF EXISTS queen.dedup_secret;
