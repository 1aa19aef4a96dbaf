-- 012_outbox_ready: the relay reads ready rows in enqueue order, without a
-- lock per row.
--
-- Version 5's relay walked the due rows by available_at, took an advisory
-- lock per key, then read each locked key's first rows to find its
-- deliverable prefix: three index walks and a lock per row. Relays now lease
-- whole shards of keys (session advisory locks on lock_key & 63, held across
-- rounds), and a round reads the ready rows of its shards in seq order from
-- one index. A row leaves that index when it cannot go out now:
--
--   waiting     it waits for a time of its own (NotBefore, retry backoff) or
--               is parked (a parked head); the relay sets it back to false
--               when the time has come (or Store.Retry does);
--   blocked_by  it is held behind such a row of its key: parked behind a
--               parked row (as in version 2), or, new here, deferred
--               (parked_at NULL) behind a row that waits; released when
--               that row is ready again.
--
-- A key's ready rows are therefore always a prefix of its undelivered rows,
-- except for rows committed while a row before them waits: the relay finds
-- those with one probe each into the (nearly empty) index of waiting rows.
-- See outbox/doc.go for the proof of order.
--
-- Existing rows: version 5 deferred the rows behind a waiting row by moving
-- their available_at; every pending Kafka row that is not due yet, and every
-- parked head, becomes waiting, so unsent rows keep their order and times.
-- Stop the old relays before applying this version: they do not know the
-- column. Applications that still enqueue with the old code are safe: the
-- relay treats a ready row that is not due as waiting.
ALTER TABLE {{.Outbox}} ADD COLUMN waiting boolean NOT NULL DEFAULT false;

UPDATE {{.Outbox}} SET waiting = true
WHERE published_at IS NULL AND blocked_by IS NULL AND handler IS NULL
  AND (available_at > now() OR parked_at IS NOT NULL);

-- The relay's read: ready Kafka rows in enqueue order.
CREATE INDEX {{.Index "Outbox" "_ready_idx"}} ON {{.Outbox}} (seq) INCLUDE (lock_key)
    WHERE published_at IS NULL AND blocked_by IS NULL AND parked_at IS NULL AND NOT waiting AND handler IS NULL;

-- Per key, its rows that wait and are not behind another (usually none).
CREATE INDEX {{.Index "Outbox" "_waiting_idx"}} ON {{.Outbox}} (lock_key, seq)
    WHERE published_at IS NULL AND blocked_by IS NULL AND waiting AND handler IS NULL;

-- Waiting rows by the time they become ready (parked ones never do).
CREATE INDEX {{.Index "Outbox" "_wake_idx"}} ON {{.Outbox}} (available_at)
    WHERE published_at IS NULL AND blocked_by IS NULL AND parked_at IS NULL AND waiting AND handler IS NULL;

-- The rows held behind a given row: released with it, by the relay or Retry.
CREATE INDEX {{.Index "Outbox" "_blocked_idx"}} ON {{.Outbox}} (blocked_by)
    WHERE blocked_by IS NOT NULL AND published_at IS NULL;

-- Version 5's relay scan is superseded; the key index now serves the
-- dispatcher only (its rows have a handler), which saves an index entry per
-- Kafka message.
DROP INDEX {{.Schema}}.{{.Index "Outbox" "_kafka_due_idx"}};
DROP INDEX {{.Schema}}.{{.Index "Outbox" "_key_idx"}};
CREATE INDEX {{.Index "Outbox" "_key_idx"}} ON {{.Outbox}} (lock_key, seq)
    WHERE published_at IS NULL AND blocked_by IS NULL AND handler IS NOT NULL;
