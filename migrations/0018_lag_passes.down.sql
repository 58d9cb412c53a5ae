-- Removes the lag passes' results; the views measure on request again.
DROP TABLE IF EXISTS queen.lag_pass;
DROP TABLE IF EXISTS queen.lag_oldest;
DROP TABLE IF EXISTS queen.lag_totals;
