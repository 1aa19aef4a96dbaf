-- 005_outbox_scan: the relay's and the dispatcher's scans read due rows only.
--
-- Version 2's scan walked every pending row in seq order (the _pending_idx
-- index), due or not, Kafka or handler, to find the due ones: its cost grew
-- with the rows waiting for a not-before time or a retry, the relay walked
-- the dispatcher's rows and the dispatcher the relay's. Each scan now reads
-- a range of an index ordered by available_at that ends at now(): rows that
-- are not due yet lie past its end and are never read. Kafka rows and handler
-- rows have an index each; handler rows are ordered within their handler, so
-- a dispatcher never reads the rows of a handler it does not run.
--
-- The scans only choose which keys a round locks; the rows of a locked key
-- are still read and delivered in seq order (the _key_idx index), and every
-- round starts from the lowest available_at (no cursor), so per-key order and
-- late commits are as before.
--
-- Building an index scans the whole table (published rows included) and
-- blocks writes to it meanwhile; cleanup keeps the table to about Retention's
-- worth of rows.

-- The relay's scan: due Kafka rows, the longest-waiting first.
CREATE INDEX {{.Index "Outbox" "_kafka_due_idx"}} ON {{.Outbox}} (available_at, seq) INCLUDE (lock_key)
    WHERE published_at IS NULL AND parked_at IS NULL AND handler IS NULL;

-- The dispatcher's scan, one handler at a time: its due rows, the
-- longest-waiting first.
CREATE INDEX {{.Index "Outbox" "_handler_due_idx"}} ON {{.Outbox}} (handler, available_at, seq) INCLUDE (lock_key)
    WHERE published_at IS NULL AND parked_at IS NULL AND handler IS NOT NULL;

-- Superseded by the two above.
DROP INDEX {{.Schema}}.{{.Index "Outbox" "_pending_idx"}};

-- A round reads a bounded window of each locked key's first rows, in seq
-- order. Rows parked behind another row of their key (blocked_by) are never
-- read by it: they leave the index, so a key with many of them costs no more
-- than a key without.
DROP INDEX {{.Schema}}.{{.Index "Outbox" "_key_idx"}};
CREATE INDEX {{.Index "Outbox" "_key_idx"}} ON {{.Outbox}} (lock_key, seq)
    WHERE published_at IS NULL AND blocked_by IS NULL;
