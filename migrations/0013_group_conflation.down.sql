-- Undoes 0013: the stored conflation policy of consumer groups.
ALTER TABLE queen.consumer_subscriptions
    DROP COLUMN IF EXISTS conflation;
