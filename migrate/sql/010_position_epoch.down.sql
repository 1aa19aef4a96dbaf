ALTER TABLE {{.ConsumerPositions}}
    DROP COLUMN epoch;
