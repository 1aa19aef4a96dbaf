-- 016_position_claims_ahead: a position may lag its partition's claims.
--
-- A runner that commits one message per transaction, several in a row on one
-- connection, claims the messages after the first without moving the
-- position, and moves it once past the run (dedup.Store.QueueClaim,
-- QueueMovePosition). claims_ahead says that such claims may lie past
-- next_offset: a runner starting there first asks, message by message,
-- whether each one was claimed at exactly its coordinates since the
-- position was last written (dedup.Store.ClaimedAt), and passes those
-- silently, as if the position were past them. A seek (dedup.Store.SeekTx)
-- clears it: what comes back after a seek comes back as duplicates. Adding
-- the column rewrites nothing.
ALTER TABLE {{.ConsumerPositions}}
    ADD COLUMN claims_ahead boolean NOT NULL DEFAULT false;
