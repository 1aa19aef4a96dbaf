-- 012_outbox_ready: back to version 5's relay scan. Rows deferred behind a
-- waiting row (blocked_by set, not parked) are released: version 5's relay
-- reads each key's rows in seq order and holds them behind the waiting row
-- by itself. Waiting rows keep their available_at, so they stay not due.
-- Stop the new relays before reverting.
UPDATE {{.Outbox}} SET blocked_by = NULL
WHERE blocked_by IS NOT NULL AND parked_at IS NULL AND published_at IS NULL;

DROP INDEX {{.Schema}}.{{.Index "Outbox" "_key_idx"}};
CREATE INDEX {{.Index "Outbox" "_key_idx"}} ON {{.Outbox}} (lock_key, seq)
    WHERE published_at IS NULL AND blocked_by IS NULL;

CREATE INDEX {{.Index "Outbox" "_kafka_due_idx"}} ON {{.Outbox}} (available_at, seq) INCLUDE (lock_key)
    WHERE published_at IS NULL AND parked_at IS NULL AND handler IS NULL;

DROP INDEX {{.Schema}}.{{.Index "Outbox" "_blocked_idx"}};
DROP INDEX {{.Schema}}.{{.Index "Outbox" "_wake_idx"}};
DROP INDEX {{.Schema}}.{{.Index "Outbox" "_waiting_idx"}};
DROP INDEX {{.Schema}}.{{.Index "Outbox" "_ready_idx"}};
ALTER TABLE {{.Outbox}} DROP COLUMN waiting;
