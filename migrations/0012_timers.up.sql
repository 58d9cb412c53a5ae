-- Timers (Queen 2.x, docs/timers.md): a message to be pushed later, one row per pending
-- (queue, timer_key). Every broker's firing task claims due rows with FOR UPDATE SKIP LOCKED,
-- writes their messages through the commit path and deletes the rows in the same transaction,
-- so a timer fires once whichever broker takes it. The queue is kept by name, not by id: a timer
-- may name a queue that does not exist yet (it is created when the timer fires, as a push
-- would). Keys compare bytewise (COLLATE "C") so the keyset list pages in one stable order.
CREATE TABLE queen.timers (
    queue          text COLLATE "C" NOT NULL,
    timer_key      text COLLATE "C" NOT NULL,
    partition_name text NOT NULL,
    -- The message data: JSON text, exactly as decoded from the schedule's base64.
    payload        text NOT NULL,
    -- The transactionId the delivered message carries (dedup applies to it).
    txn            text NOT NULL,
    -- Promised at schedule time; the delivered message's id.
    message_id     uuid NOT NULL,
    producer_sub   text,
    deliver_at     timestamptz NOT NULL,
    -- Fires the queue refused (maxSize reached, encrypted without a key), and the last reason.
    attempts       integer NOT NULL DEFAULT 0,
    last_error     text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue, timer_key)
);

-- The firing task's scan: the due rows, oldest first.
CREATE INDEX timers_due ON queen.timers (deliver_at);
