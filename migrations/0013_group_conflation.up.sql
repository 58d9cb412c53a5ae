-- Conflation (reference §2.8, docs/consuming-2x.md): a consumer group may be a last-value
-- consumer of a queue. The policy is the group's, stored with its subscription when the group
-- first registers on the queue (its first pop), and the stored value wins afterwards: a pop
-- that asks otherwise is told `conflationConflict`. Deleting the group with its metadata deletes
-- the row, and with it the policy. A column with a constant default: no table rewrite.
ALTER TABLE queen.consumer_subscriptions
    ADD COLUMN IF NOT EXISTS conflation BOOLEAN NOT NULL DEFAULT false;
