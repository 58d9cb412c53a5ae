-- Removes the timers table (pending timers are lost).
DROP TABLE IF EXISTS queen.timers;
