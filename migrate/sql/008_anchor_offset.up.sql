-- 008_anchor_offset: the anchor of a position names its record.
--
-- anchor_offset is the offset of the record whose timestamp anchor_time is:
-- the last data record the consumer passed. It is next_offset - 1 after a
-- message, and stays behind when the position moves on over transaction
-- markers and records of aborted transactions, which have no timestamp of
-- their own to compare. NULL with anchor_time NULL (not known), or for a
-- position written by version 6 (then the anchor is at next_offset - 1).
ALTER TABLE {{.ConsumerPositions}}
    ADD COLUMN anchor_offset bigint CHECK (anchor_offset >= 0);
