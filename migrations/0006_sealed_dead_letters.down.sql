-- Removes the sealed-payload flag of dead letters (migrations/0006_sealed_dead_letters.up.sql).
ALTER TABLE queen.dead_letters DROP COLUMN payload_sealed;
