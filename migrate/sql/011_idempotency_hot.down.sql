-- 011_idempotency_hot: back to version 3's layout: the index of records held
-- past their lease, and full heap pages.
ALTER TABLE {{.IdempotencyRecords}} RESET (fillfactor);

CREATE INDEX {{.Index "IdempotencyRecords" "_stuck_idx"}} ON {{.IdempotencyRecords}} (locked_until)
    WHERE state = 'PROCESSING';
