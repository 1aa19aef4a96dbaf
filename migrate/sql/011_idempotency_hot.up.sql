-- 011_idempotency_hot: completing an HTTP idempotency record becomes a HOT
-- update (issue 17).
--
-- A request reserves its key with an INSERT (PROCESSING), then completes
-- the record with an UPDATE in its handler's transaction. PostgreSQL makes
-- that UPDATE a heap-only tuple (HOT) update, which writes no index entry
-- and leaves the old version for page pruning rather than VACUUM, only when
-- it changes no indexed column (a partial index's condition counts) and the
-- new version fits on the same page. Version 3's partial index on
-- locked_until WHERE state = 'PROCESSING' made every completion a non-HOT
-- update, with a new entry in each of the three indexes: it is dropped.
-- Listing stuck records (idemhttp.Store.FindStuck, `idemkit idemhttp stuck`)
-- reads the table instead, which suits a job run every few minutes. The
-- completion keeps expires_at as it is whenever it completes within its
-- lease (see package idemhttp), so the index on expires_at that purges use
-- does not stop HOT either.
--
-- fillfactor leaves 30% of each heap page free for the completed versions of
-- the records inserted on it. It applies to pages filled from now on;
-- existing rows are not moved.
DROP INDEX {{.Schema}}.{{.Index "IdempotencyRecords" "_stuck_idx"}};

ALTER TABLE {{.IdempotencyRecords}} SET (fillfactor = 70);
