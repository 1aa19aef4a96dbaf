-- 015_dedup_daily: back to one flat table. The daily table's rows are
-- copied into the processed-messages table first (as uuid keys, which
-- version 14 stores), so no claim is forgotten; on a large daily table this
-- takes as long as the copy, and claims wait meanwhile. Stop the consumers
-- first: a runner that read the daily layout fails its next claim of a
-- UUIDv7 once the table is gone (it stops with ErrNotMigrated).
--
-- The daily table is locked before anything is read from it: a claim in
-- flight commits before the copy, or waits and then fails.
LOCK TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_daily"}} IN ACCESS EXCLUSIVE MODE;
ALTER TABLE {{.ProcessedMessages}} DROP CONSTRAINT IF EXISTS {{.Index "ProcessedMessages" "_daily_from"}};
INSERT INTO {{.ProcessedMessages}} (consumer, message_uuid, topic, kafka_partition, kafka_offset, processed_at)
    SELECT consumer, message_uuid, topic, kafka_partition, kafka_offset, processed_at
    FROM {{.Schema}}.{{.Index "ProcessedMessages" "_daily"}}
    ON CONFLICT DO NOTHING;
DROP TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_daily"}};
DROP TABLE {{.Schema}}.{{.Index "ProcessedMessages" "_layout"}};
ALTER TABLE {{.ProcessedMessages}} RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
ALTER TABLE {{.ConsumerPositions}} RESET (fillfactor);
