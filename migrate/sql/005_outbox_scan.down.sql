-- 005_outbox_scan: back to version 2's scan and key indexes.
CREATE INDEX {{.Index "Outbox" "_pending_idx"}} ON {{.Outbox}} (seq)
    WHERE published_at IS NULL AND parked_at IS NULL;

DROP INDEX {{.Schema}}.{{.Index "Outbox" "_key_idx"}};
CREATE INDEX {{.Index "Outbox" "_key_idx"}} ON {{.Outbox}} (lock_key, seq)
    WHERE published_at IS NULL;

DROP INDEX {{.Schema}}.{{.Index "Outbox" "_handler_due_idx"}};
DROP INDEX {{.Schema}}.{{.Index "Outbox" "_kafka_due_idx"}};
