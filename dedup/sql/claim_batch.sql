-- claim_batch: claims many IDs of any consumers, topics and partitions, in
-- order ($1 to $5: consumer, text ID or NULL, topic, partition, offset per
-- claim; $6: the uuid or NULL; $7: the day for the daily table or NULL),
-- and moves one position per (consumer, topic, partition) ($8 to $13).
-- Returns the ordinal of each claim that claimed (the others are
-- duplicates).
WITH input AS (
	SELECT *, coalesce(i.message_id, i.message_uuid::text) AS k
	FROM unnest($1::text[], $2::text[], $3::text[], $4::int[], $5::bigint[], $6::uuid[], $7::date[]) WITH ORDINALITY
		AS i (consumer, message_id, topic, kafka_partition, kafka_offset, message_uuid, day, ord)
), claimed AS (
	INSERT INTO {{processed}} (consumer, message_id, message_uuid, topic, kafka_partition, kafka_offset)
	SELECT i.consumer, i.message_id, i.message_uuid, i.topic, i.kafka_partition, i.kafka_offset
	FROM input AS i
	WHERE i.day IS NULL
	ORDER BY i.ord
	ON CONFLICT DO NOTHING
	RETURNING consumer, coalesce(message_id, message_uuid::text) AS k
), claimed_daily AS (
	INSERT INTO {{daily}} (consumer, message_uuid, day, topic, kafka_partition, kafka_offset)
	SELECT i.consumer, i.message_uuid, i.day, i.topic, i.kafka_partition, i.kafka_offset
	FROM input AS i
	WHERE i.day IS NOT NULL
	ORDER BY i.ord
	ON CONFLICT DO NOTHING
	RETURNING consumer, message_uuid::text AS k
), {{template "position" "SELECT * FROM unnest($8::text[], $9::text[], $10::int[], $11::bigint[], $12::timestamptz[], $13::bigint[])"}}
SELECT input.ord FROM input JOIN (SELECT * FROM claimed UNION ALL SELECT * FROM claimed_daily) AS c USING (consumer, k)
