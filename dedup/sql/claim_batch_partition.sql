-- claim_batch_partition: claim_batch for claims of one consumer ($1), topic
-- ($3) and partition ($5), which travel once instead of once per claim:
-- $2 text IDs or NULLs, $4 offsets, $9 uuids or NULLs, $10 days or NULLs;
-- the position moves to $6, anchored at $7 under epoch $8. Returns the
-- ordinal of each claim that claimed.
WITH input AS (
	SELECT *, coalesce(i.message_id, i.message_uuid::text) AS k
	FROM unnest($2::text[], $4::bigint[], $9::uuid[], $10::date[]) WITH ORDINALITY
		AS i (message_id, kafka_offset, message_uuid, day, ord)
), claimed AS (
	INSERT INTO {{processed}} (consumer, message_id, message_uuid, topic, kafka_partition, kafka_offset)
	SELECT $1::text, i.message_id, i.message_uuid, $3::text, $5::int, i.kafka_offset
	FROM input AS i
	WHERE i.day IS NULL
	ORDER BY i.ord
	ON CONFLICT DO NOTHING
	RETURNING coalesce(message_id, message_uuid::text) AS k
), claimed_daily AS (
	INSERT INTO {{daily}} (consumer, message_uuid, day, topic, kafka_partition, kafka_offset)
	SELECT $1::text, i.message_uuid, i.day, $3::text, $5::int, i.kafka_offset
	FROM input AS i
	WHERE i.day IS NOT NULL
	ORDER BY i.ord
	ON CONFLICT DO NOTHING
	RETURNING message_uuid::text AS k
), {{template "position" "VALUES ($1::text, $3::text, $5::int, $6::bigint, $7::timestamptz, $8::bigint)"}}
SELECT input.ord FROM input JOIN (SELECT * FROM claimed UNION ALL SELECT * FROM claimed_daily) AS c USING (k)
