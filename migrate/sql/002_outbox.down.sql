-- 002_outbox: drop the outbox table (its indexes go with it).
DROP TABLE {{.Outbox}};
