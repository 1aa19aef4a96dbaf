-- claim: claims one message ID in the flat table. $2 is the ID as text,
-- or NULL when $3 holds it as a uuid (a canonical UUID). No row inserted: a
-- duplicate.
INSERT INTO {{processed}} (consumer, message_id, message_uuid, topic, kafka_partition, kafka_offset)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT DO NOTHING
