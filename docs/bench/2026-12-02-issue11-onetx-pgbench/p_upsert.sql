\set off :off + 1
\set n :off + 1
\set mid :client_id * 100000000 + :off
\set acct :client_id + 6 * random(0, 166)
\startpipeline
BEGIN;
INSERT INTO b.processed_messages (consumer, message_id, topic, kafka_partition, kafka_offset) VALUES (:cons, :mid, :topic, :client_id, :off) ON CONFLICT DO NOTHING;
INSERT INTO b.consumer_positions AS p (consumer, topic, kafka_partition, next_offset, anchor_time, anchor_offset, epoch) VALUES (:cons, :topic, :client_id, :n, :ts::timestamptz, CASE WHEN :ts::timestamptz IS NULL THEN NULL ELSE :n::bigint - 1 END, 0) ON CONFLICT (consumer, topic, kafka_partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, anchor_offset = CASE WHEN EXCLUDED.anchor_time IS NULL THEN p.anchor_offset ELSE EXCLUDED.anchor_offset END, anchor_time = coalesce(EXCLUDED.anchor_time, p.anchor_time), updated_at = now() WHERE p.next_offset < EXCLUDED.next_offset AND p.epoch = EXCLUDED.epoch;
\endpipeline
INSERT INTO b.accounts AS a (id, balance, updated) VALUES (:acct, 7, 1) ON CONFLICT (id) DO UPDATE SET balance = a.balance + excluded.balance, updated = a.updated + 1;
COMMIT;
