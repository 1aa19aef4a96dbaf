\set off :off + 1
\set n :off + 1
\set mid :client_id * 100000000 + :off
\set acct :client_id + 6 * random(0, 166)
BEGIN;
INSERT INTO b.processed_messages (consumer, message_id, topic, kafka_partition, kafka_offset) VALUES (:cons, :mid, :topic, :client_id, :off) ON CONFLICT DO NOTHING;
INSERT INTO b.accounts AS a (id, balance, updated) VALUES (:acct, 7, 1) ON CONFLICT (id) DO UPDATE SET balance = a.balance + excluded.balance, updated = a.updated + 1;
COMMIT;
