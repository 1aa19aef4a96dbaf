-- 013_idempotency_noindex: the HTTP idempotency records keep only their
-- primary key (issue 17).
--
-- Since this version a request in transaction mode writes its record once,
-- COMPLETED, with its commit. The index on expires_at got an entry from
-- every one of those inserts, all on its right-most page (expiry grows with
-- time), which concurrent requests fought over. Purges
-- (idemhttp.Store.Purge) now walk the table by ranges of pages instead
-- (TID range scans, PostgreSQL 14 or later).
DROP INDEX {{.Schema}}.{{.Index "IdempotencyRecords" "_expires_at_idx"}};
