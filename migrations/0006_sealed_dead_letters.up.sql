-- A dead letter copies its message's payload as stored: for a queue with encryptionEnabled that
-- is the sealed text (src/storage/crypto.rs). This column says so, taken from the version byte of
-- the segment the message came from, so the DLQ route opens it instead of showing the seal.
ALTER TABLE queen.dead_letters ADD COLUMN payload_sealed BOOLEAN NOT NULL DEFAULT FALSE;
