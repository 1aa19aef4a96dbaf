-- 001_dedup: drop the dedup store's tables (their indexes go with them).
DROP TABLE {{.ConsumerPositions}};
DROP TABLE {{.ProcessedMessages}};
