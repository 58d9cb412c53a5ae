-- Removes message traces (migrations/0005_traces.up.sql).
DROP TABLE queen.message_trace_names;
DROP TABLE queen.message_traces;
