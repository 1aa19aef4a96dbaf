-- 013_idempotency_noindex: back to the index on expires_at that purges used.
CREATE INDEX {{.Index "IdempotencyRecords" "_expires_at_idx"}} ON {{.IdempotencyRecords}} (expires_at);
