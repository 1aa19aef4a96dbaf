{{/*
position: the CTEs that move a consumer's position, given a statement whose
rows are (consumer, topic, partition, next offset, anchor time, epoch), and
insert a row that does not exist yet. Included by the statements that claim
with the position and by save_position.

A position never moves back: a redelivered or replayed message at a lower
offset leaves it as it is. The anchor (the record at next_offset - 1 and its
timestamp) moves with the position when the time is known; a position that
moves on without one (over transaction markers) keeps the last anchor. A
position written under another epoch (a seek happened since its writer
read it) is left as it is.

A row exists from a partition's first write on, so it is moved by a plain
UPDATE (INSERT … ON CONFLICT DO UPDATE would lock it first, one more WAL
record per message). A row the UPDATE did not move either does not exist,
is ahead, has another epoch, or was inserted by a transaction that
committed after the statement's snapshot (two first writers during a
rebalance): ON CONFLICT DO UPDATE rechecks the committed row, so the last
case still moves it.
*/}}
{{- define "position" -}}
position_input AS (
	SELECT * FROM ({{.}}) AS v (c, t, k, n, a, e)
), position_moved AS (
	UPDATE {{positions}} AS p SET next_offset = v.n,
		anchor_offset = CASE WHEN v.a IS NULL THEN p.anchor_offset ELSE v.n - 1 END,
		anchor_time = coalesce(v.a, p.anchor_time), updated_at = now()
	FROM position_input AS v
	WHERE p.consumer = v.c AND p.topic = v.t AND p.kafka_partition = v.k
		AND p.next_offset < v.n AND p.epoch = v.e
	RETURNING p.consumer, p.topic, p.kafka_partition
), position_new AS (
	{{template "position_insert"}}
)
{{- end}}

{{- define "position_insert" -}}
INSERT INTO {{positions}} AS p (consumer, topic, kafka_partition, next_offset, anchor_time, anchor_offset, epoch)
	SELECT c, t, k, n, a, CASE WHEN a IS NULL THEN NULL ELSE n - 1 END, e FROM position_input AS v
	WHERE NOT EXISTS (SELECT 1 FROM position_moved AS m
		WHERE m.consumer = v.c AND m.topic = v.t AND m.kafka_partition = v.k)
	ON CONFLICT (consumer, topic, kafka_partition) DO UPDATE
	SET next_offset = EXCLUDED.next_offset,
		anchor_offset = CASE WHEN EXCLUDED.anchor_time IS NULL THEN p.anchor_offset ELSE EXCLUDED.anchor_offset END,
		anchor_time = coalesce(EXCLUDED.anchor_time, p.anchor_time), updated_at = now()
	WHERE p.next_offset < EXCLUDED.next_offset AND p.epoch = EXCLUDED.epoch
{{- end}}
