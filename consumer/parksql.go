package consumer

import (
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/migrate"
)

// parkSQL are the statements on the parked-messages table (NonBlocking
// mode), one per query, with the table's quoted name put in once. $1 is
// always the consumer's name and $2 the topic.
type parkSQL struct {
	// keys counts a partition's ($3) parked messages per key.
	keys string
	// insert parks one message; $14 is the delay of its next attempt in
	// microseconds, on the database's clock. A conflict is the same record
	// parked again (a redelivery): its coordinates, incarnation included,
	// identify it.
	insert string
	// head reads the first parked message of key $4 on partition $3, in
	// (incarnation, offset) order, and whether it is due.
	head string
	// dueKeys lists the keys of partition $3 whose head is due.
	dueKeys string
	// remove deletes one parked message by its primary key.
	remove string
	// failed records a failed attempt of a parked head and its next one.
	failed string
	// list is ListParked's: the messages selected by parkedFilter, each
	// key's head marked, with how many wait behind it; $5 is the limit.
	list string
	// retry is RetryParked's: the selected heads made due now, by their
	// primary key, in one statement.
	retry string
}

// parkedColumns are the columns ListParked and RetryParked read.
const parkedColumns = `consumer, topic, kafka_partition, incarnation, kafka_offset, message_key, message_id, value, headers,
	message_time, attempts, first_failed_at, last_failed_at, last_error, next_attempt_at, parked_at`

// parkedFilter is the WHERE clause of list and retry: $1 consumer, $2
// topic, $3 partitions (NULL: all), $4 keys (NULL: all).
const parkedFilter = `consumer = $1 AND topic = $2
	AND ($3::int[] IS NULL OR kafka_partition = ANY($3))
	AND ($4::bytea[] IS NULL OR message_key = ANY($4))`

func newParkSQL(t migrate.Tables) parkSQL {
	table := pgx.Identifier{t.Schema, t.ParkedMessages}.Sanitize()
	return parkSQL{
		keys: `SELECT message_key, count(*) FROM ` + table + `
	WHERE consumer = $1 AND topic = $2 AND kafka_partition = $3 GROUP BY message_key`,

		insert: `INSERT INTO ` + table + ` (consumer, topic, kafka_partition, kafka_offset, message_key,
	message_id, value, headers, message_time, attempts, first_failed_at, last_failed_at, last_error, next_attempt_at,
	incarnation)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, now() + $14::bigint * interval '1 microsecond', $15)
ON CONFLICT DO NOTHING`,

		head: `SELECT incarnation, kafka_offset, message_id, value, headers, message_time, attempts,
	first_failed_at, next_attempt_at <= now() FROM ` + table + `
WHERE consumer = $1 AND topic = $2 AND kafka_partition = $3 AND message_key = $4
ORDER BY incarnation, kafka_offset LIMIT 1`,

		dueKeys: `SELECT message_key FROM (
	SELECT DISTINCT ON (message_key) message_key, next_attempt_at FROM ` + table + `
	WHERE consumer = $1 AND topic = $2 AND kafka_partition = $3
	ORDER BY message_key, incarnation, kafka_offset) heads
WHERE next_attempt_at <= now()`,

		remove: `DELETE FROM ` + table + ` WHERE consumer = $1 AND topic = $2 AND kafka_partition = $3
	AND incarnation = $4 AND kafka_offset = $5`,

		failed: `UPDATE ` + table + ` SET attempts = $5, first_failed_at = coalesce(first_failed_at, $6),
	last_failed_at = $7, last_error = $8, next_attempt_at = now() + $9::bigint * interval '1 microsecond'
WHERE consumer = $1 AND topic = $2 AND kafka_partition = $3 AND kafka_offset = $4 AND incarnation = $10`,

		list: `SELECT ` + parkedColumns + `, head, behind, next_attempt_at <= now() FROM (
	SELECT ` + parkedColumns + `,
		row_number() OVER w = 1 AS head, count(*) OVER (PARTITION BY kafka_partition, message_key) - 1 AS behind
	FROM ` + table + ` WHERE ` + parkedFilter + `
	WINDOW w AS (PARTITION BY kafka_partition, message_key ORDER BY incarnation, kafka_offset)) p
ORDER BY kafka_partition, incarnation, kafka_offset LIMIT $5`,

		retry: `WITH heads AS (
	SELECT DISTINCT ON (kafka_partition, message_key) kafka_partition, incarnation, kafka_offset, next_attempt_at,
		count(*) OVER (PARTITION BY kafka_partition, message_key) - 1 AS behind
	FROM ` + table + ` WHERE ` + parkedFilter + `
	ORDER BY kafka_partition, message_key, incarnation, kafka_offset)
UPDATE ` + table + ` t SET next_attempt_at = least(t.next_attempt_at, now())
FROM heads h
WHERE t.consumer = $1 AND t.topic = $2 AND t.kafka_partition = h.kafka_partition
	AND t.incarnation = h.incarnation AND t.kafka_offset = h.kafka_offset
RETURNING t.consumer, t.topic, t.kafka_partition, t.incarnation, t.kafka_offset, t.message_key, t.message_id,
	t.value, t.headers, t.message_time, t.attempts, t.first_failed_at, t.last_failed_at, t.last_error,
	t.next_attempt_at, t.parked_at, h.behind, h.next_attempt_at, t.next_attempt_at <= now()`,
	}
}
