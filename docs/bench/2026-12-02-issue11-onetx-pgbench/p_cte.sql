\set off :off + 1
\set n :off + 1
\set mid :client_id * 100000000 + :off
\set acct :client_id + 6 * random(0, 166)
\startpipeline
BEGIN;
WITH claimed AS (
	INSERT INTO b.processed_messages (consumer, message_id, topic, kafka_partition, kafka_offset)
	VALUES (:cons, :mid, :topic, :client_id, :off)
	ON CONFLICT DO NOTHING
	RETURNING 1
), position_input AS (
	SELECT * FROM (VALUES (:cons::text, :topic::text, :client_id::int, :n::bigint, :ts::timestamptz, 0::bigint)) AS v (c, t, k, n, a, e)
), position_moved AS (
	UPDATE b.consumer_positions AS p SET next_offset = v.n,
		anchor_offset = CASE WHEN v.a IS NULL THEN p.anchor_offset ELSE v.n - 1 END,
		anchor_time = coalesce(v.a, p.anchor_time), updated_at = now()
	FROM position_input AS v
	WHERE p.consumer = v.c AND p.topic = v.t AND p.kafka_partition = v.k
		AND p.next_offset < v.n AND p.epoch = v.e
	RETURNING p.consumer, p.topic, p.kafka_partition
), position_new AS (
	INSERT INTO b.consumer_positions AS p (consumer, topic, kafka_partition, next_offset, anchor_time, anchor_offset, epoch)
	SELECT c, t, k, n, a, CASE WHEN a IS NULL THEN NULL ELSE n - 1 END, e FROM position_input AS v
	WHERE NOT EXISTS (SELECT 1 FROM position_moved AS m
		WHERE m.consumer = v.c AND m.topic = v.t AND m.kafka_partition = v.k)
	ON CONFLICT (consumer, topic, kafka_partition) DO UPDATE
	SET next_offset = EXCLUDED.next_offset,
		anchor_offset = CASE WHEN EXCLUDED.anchor_time IS NULL THEN p.anchor_offset ELSE EXCLUDED.anchor_offset END,
		anchor_time = coalesce(EXCLUDED.anchor_time, p.anchor_time), updated_at = now()
	WHERE p.next_offset < EXCLUDED.next_offset AND p.epoch = EXCLUDED.epoch
)
SELECT NOT EXISTS (SELECT 1 FROM claimed);
\endpipeline
INSERT INTO b.accounts AS a (id, balance, updated) VALUES (:acct, 7, 1) ON CONFLICT (id) DO UPDATE SET balance = a.balance + excluded.balance, updated = a.updated + 1;
COMMIT;
