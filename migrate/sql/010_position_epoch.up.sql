-- 010_position_epoch: a seek fences the consumers that were running.
--
-- epoch counts the seeks of a position (dedup.Store.SeekTx, `idemkit
-- consumer seek`). A runner reads it when a partition is assigned and its
-- position writes require it unchanged: a member removed by a forced seek,
-- whose transaction was in flight, cannot move the position on again after
-- the seek (its claims still commit, so what it applied is a duplicate when
-- read again).
ALTER TABLE {{.ConsumerPositions}}
    ADD COLUMN epoch bigint NOT NULL DEFAULT 0 CHECK (epoch >= 0);
