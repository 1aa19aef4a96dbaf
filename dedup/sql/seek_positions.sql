-- seek_positions: writes consumer $1's positions in topic $2: partitions
-- $3 move to $4 with incarnations $5, their anchor cleared and their epoch
-- raised (or 1 for a new row). Returns the rows written.
INSERT INTO {{positions}} AS p
	(consumer, topic, kafka_partition, next_offset, incarnation, anchor_time, epoch, updated_at)
SELECT $1, $2, t.kafka_partition, t.next_offset, t.incarnation, NULL, 1, now()
FROM unnest($3::int[], $4::bigint[], $5::bigint[]) AS t (kafka_partition, next_offset, incarnation)
ORDER BY t.kafka_partition
ON CONFLICT (consumer, topic, kafka_partition) DO UPDATE
SET next_offset = EXCLUDED.next_offset, incarnation = EXCLUDED.incarnation, anchor_time = NULL, anchor_offset = NULL,
	epoch = p.epoch + 1, updated_at = now()
RETURNING {{template "position_columns"}}
