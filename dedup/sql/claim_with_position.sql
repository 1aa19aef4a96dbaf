-- claim_with_position: claim (same parameters, $1 to $6) and, in the same
-- statement, move the position of the claim's partition to $7, anchored at
-- $8 under epoch $9. Returns whether the claim was a duplicate.
WITH claimed AS (
	INSERT INTO {{processed}} (consumer, message_id, message_uuid, topic, kafka_partition, kafka_offset)
	VALUES ($1, $2, $3, $4, $5, $6)
	ON CONFLICT DO NOTHING
	RETURNING 1
), {{template "position" "VALUES ($1::text, $4::text, $5::int, $7::bigint, $8::timestamptz, $9::bigint)"}}
SELECT NOT EXISTS (SELECT 1 FROM claimed)
