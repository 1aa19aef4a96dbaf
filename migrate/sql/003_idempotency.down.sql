-- 003_idempotency: drop the HTTP idempotency records (their indexes go with them).
DROP TABLE {{.IdempotencyRecords}};
