ALTER TABLE queen.segments ALTER COLUMN frames SET COMPRESSION default;
