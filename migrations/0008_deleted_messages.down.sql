DROP TABLE IF EXISTS queen.deleted_messages;
