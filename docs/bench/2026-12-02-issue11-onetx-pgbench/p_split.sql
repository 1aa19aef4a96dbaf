\set off :off + 1
\set n :off + 1
\set mid :client_id * 100000000 + :off
\set acct :client_id + 6 * random(0, 166)
\startpipeline
BEGIN;
INSERT INTO b.processed_messages (consumer, message_id, topic, kafka_partition, kafka_offset) VALUES (:cons, :mid, :topic, :client_id, :off) ON CONFLICT DO NOTHING;
UPDATE b.consumer_positions AS p SET next_offset = :n, anchor_offset = CASE WHEN :ts::timestamptz IS NULL THEN p.anchor_offset ELSE :n::bigint - 1 END, anchor_time = coalesce(:ts::timestamptz, p.anchor_time), updated_at = now() WHERE p.consumer = :cons AND p.topic = :topic AND p.kafka_partition = :client_id AND p.next_offset < :n AND p.epoch = 0;
\endpipeline
INSERT INTO b.accounts AS a (id, balance, updated) VALUES (:acct, 7, 1) ON CONFLICT (id) DO UPDATE SET balance = a.balance + excluded.balance, updated = a.updated + 1;
COMMIT;
