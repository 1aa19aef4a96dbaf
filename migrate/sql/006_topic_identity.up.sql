-- 006_topic_identity: recognise a topic that was deleted and created again.
--
-- incarnation counts the recreations of the topic this consumer moved onto
-- (0 for the first): message IDs made from coordinates and dead-letter
-- replay records include it, so two incarnations never collide.
-- anchor_time is the timestamp of the record at next_offset - 1 (the last
-- one this consumer passed), written with every position; at assignment the
-- runner reads that record back and compares: another timestamp there means
-- another topic. NULL (after a seek, or positions written before version 6)
-- means "not known": the position is trusted and the anchor set again at the
-- next commit.
ALTER TABLE {{.ConsumerPositions}}
    ADD COLUMN incarnation bigint NOT NULL DEFAULT 0 CHECK (incarnation >= 0),
    ADD COLUMN anchor_time timestamptz;
