ALTER TABLE {{.ConsumerPositions}}
    DROP COLUMN anchor_offset;
