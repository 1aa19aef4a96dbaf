-- move_position: moves an existing position row ($1 consumer, $2 topic, $3
-- partition) on to $4, anchored at $5 (NULL: the anchor stays), under epoch
-- $6 only, never back. No row updated: the row is ahead, has another epoch,
-- or does not exist (save_position inserts it).
UPDATE {{positions}} AS p SET next_offset = $4::bigint,
	anchor_offset = CASE WHEN $5::timestamptz IS NULL THEN p.anchor_offset ELSE $4::bigint - 1 END,
	anchor_time = coalesce($5::timestamptz, p.anchor_time), updated_at = now()
WHERE p.consumer = $1::text AND p.topic = $2::text AND p.kafka_partition = $3::int
	AND p.next_offset < $4::bigint AND p.epoch = $6::bigint
