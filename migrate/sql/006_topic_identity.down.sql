ALTER TABLE {{.ConsumerPositions}}
    DROP COLUMN anchor_time,
    DROP COLUMN incarnation;
