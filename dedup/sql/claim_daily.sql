-- claim_daily: claims one UUIDv7 in the daily table, in the partition of
-- $3, its day. No row inserted: a duplicate.
INSERT INTO {{daily}} (consumer, message_uuid, day, topic, kafka_partition, kafka_offset)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT DO NOTHING
