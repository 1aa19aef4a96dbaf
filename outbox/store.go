package outbox

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/internal/pgexec"
	"github.com/idemkit/idemkit/migrate"
)

// HeaderID is the Kafka header that carries a message's stable ID. It equals
// consumer.IDHeaderDefault, so idemkit consumers deduplicate on it by default.
const HeaderID = "message-id"

// Limits on what EnqueueTx accepts.
const (
	// MaxTopicLength is Kafka's longest topic name.
	MaxTopicLength = 249
	// MaxHandlerLength is the longest Dispatcher handler name, in bytes.
	MaxHandlerLength = 255
)

// CleanupBatchDefault is the number of rows Cleanup deletes per statement
// when given a batch size of zero or less.
const CleanupBatchDefault = 1000

// ErrInvalidMessage matches (with errors.Is) every error EnqueueTx returns
// for a message rejected before any SQL runs; nothing is written then.
var ErrInvalidMessage = errors.New("outbox: invalid message")

// ErrNotMigrated means the outbox table does not exist: run package migrate
// with the same Schema and table name.
var ErrNotMigrated = fmt.Errorf("outbox: table missing: %w", idemkit.ErrNotMigrated)

// ErrNotFound is returned by Retry when none of the given IDs names a dead
// message.
var ErrNotFound = errors.New("outbox: no dead message with these IDs")

// MessageError reports which message of an EnqueueTx call was rejected and
// why. errors.Is(err, ErrInvalidMessage) is true for it.
type MessageError struct {
	// Index is the message's position in the EnqueueTx call.
	Index int
	// Reason says what is wrong with it.
	Reason string
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("outbox: invalid message %d: %s", e.Index, e.Reason)
}

// Is reports whether target is ErrInvalidMessage.
func (e *MessageError) Is(target error) bool { return target == ErrInvalidMessage }

// Message is one side effect to deliver after the enqueuing transaction
// commits.
type Message struct {
	// Topic is the Kafka topic; required unless Handler is set. The topic
	// must exist when the relay publishes: the relay never creates topics.
	Topic string
	// Key is the Kafka key. Messages with the same Topic and Key are
	// delivered in enqueue order. A message without a key (nil or empty) has
	// no order relative to other messages.
	Key []byte
	// Value is the payload.
	Value []byte
	// Headers are extra Kafka headers. HeaderID is added by the relay and
	// must not be set here.
	Headers []kafka.Header
	// NotBefore, when set, holds the message (and the messages of its key
	// enqueued after it) until this time, compared with the database clock.
	NotBefore time.Time
	// Handler, when set, makes the message a non-Kafka side effect: a
	// Dispatcher runs the handler registered under this name, and the relay
	// never publishes it. Topic is then optional (informative only), and the
	// order scope is (Handler, Key).
	Handler string
}

// Config says where the outbox table lives. It is created by package migrate,
// which must be given the same migrate.Tables: the one value every package
// takes to say where its tables live.
type Config struct {
	// Tables says where the tables live (migrate.Tables; the zero value:
	// schema "public", every default name); this store uses Tables.Outbox,
	// which defaults to "idemkit_outbox" (migrate.OutboxDefault).
	Tables migrate.Tables
	// ContextHeaders, when set, is called once per EnqueueTx with its
	// context; the headers it returns are added to every message enqueued
	// (after the message's own, skipping a key the message already has):
	// the current trace context, for example (see the module
	// github.com/idemkit/idemkit/idemotel), so that the relay publishes it and
	// the consumer continues the trace. A header named HeaderID is an
	// error of EnqueueTx.
	ContextHeaders func(ctx context.Context) []kafka.Header
}

// DBTX runs queries: a pgx.Tx, a *pgxpool.Pool and a *pgx.Conn all satisfy it.
type DBTX = pgexec.DB

// TxBeginner starts a transaction: a *pgxpool.Pool, a *pgx.Conn and a pgx.Tx
// (a savepoint) all satisfy it.
type TxBeginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

var (
	_ DBTX       = pgx.Tx(nil)
	_ DBTX       = (*pgxpool.Pool)(nil)
	_ TxBeginner = (*pgxpool.Pool)(nil)
	_ TxBeginner = (*pgx.Conn)(nil)
)

// Store enqueues messages and administers the outbox table. It holds no
// connection and no state besides its SQL: it is safe for concurrent use.
type Store struct {
	table   string // schema-qualified, quoted
	name    string // schema.table, unquoted
	ident   string // raw "schema"."table", hashed into lock keys and the channel
	channel string // NOTIFY channel
	shardNS int32  // first key of the relays' shard advisory locks
	sql     storeSQL
	stamp   func(ctx context.Context) []kafka.Header
}

type storeSQL struct {
	enqueue, dead, retryLock, retryRows, retry, stats, cleanup string
	// The relay's and the dispatcher's statements.
	scanHandler, keyRows, markDone, markFailed string
	// The relay's statements (see relayloop.go).
	promote, read, fail, block, acquire, release, migrated, join, members string
}

// New returns a Store for the table cfg names. cfg may be nil, meaning every
// default. An invalid cfg returns an error wrapping migrate.ErrInvalidConfig.
// New does not touch the database.
func New(cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	mc := c.Tables.WithDefaults()
	if err := mc.Validate(); err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	s := &Store{
		table: pgx.Identifier{mc.Schema, mc.Outbox}.Sanitize(),
		name:  mc.Schema + "." + mc.Outbox,
		ident: pgx.Identifier{mc.Schema, mc.Outbox}.Sanitize(),
		stamp: c.ContextHeaders,
	}
	h := fnv.New64a()
	h.Write([]byte(s.ident))
	s.channel = fmt.Sprintf("idemkit_outbox_%016x", h.Sum64())
	s.sql = buildSQL(s.table)
	relaySQL(s.table, &s.sql)
	h.Reset()
	h.Write([]byte("shards:" + s.ident))
	s.shardNS = int32(h.Sum64())
	return s, nil
}

// Channel is the PostgreSQL NOTIFY channel EnqueueTx signals on commit; relays
// and dispatchers LISTEN on it.
func (s *Store) Channel() string { return s.channel }

// Table returns the schema-qualified, quoted table name, for SQL.
func (s *Store) Table() string { return s.table }

// Name returns the table as schema.table, unquoted: for labels and
// messages.
func (s *Store) Name() string { return s.name }

func buildSQL(t string) storeSQL {
	// The scans choose which keys a round locks. Each walks an index range
	// that holds the pending rows of its kind ordered by
	// available_at and ends at now(), so rows that are not due yet are never
	// read, and takes, without waiting, the advisory lock of each row's key;
	// a row whose key another relay holds is passed over, like SKIP LOCKED at
	// key granularity. The lock is re-entrant: every due row of a key this
	// transaction holds passes, and is returned with its seq. The CASE keeps
	// the lock call behind the due test whatever plan is chosen. Every round
	// starts from the lowest available_at: no cursor.
	scan := func(dest string) string {
		return `SELECT lock_key, seq FROM ` + t + `
WHERE published_at IS NULL AND dead_at IS NULL AND ` + dest + ` AND available_at <= now()
  AND CASE WHEN available_at <= now() THEN pg_try_advisory_xact_lock(lock_key) ELSE false END
ORDER BY available_at, seq
LIMIT $1`
	}
	return storeSQL{
		enqueue: `WITH ins AS (
	INSERT INTO ` + t + ` (id, handler, topic, msg_key, value, headers, lock_key, available_at, waiting)
	SELECT id, handler, topic, msg_key, value, headers, lock_key, COALESCE(not_before, now()),
		handler IS NULL AND COALESCE(not_before > now(), false)
	FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bytea[], $5::bytea[], $6::jsonb[], $7::bigint[], $8::timestamptz[])
		WITH ORDINALITY AS m (id, handler, topic, msg_key, value, headers, lock_key, not_before, ord)
	ORDER BY ord
	RETURNING 1
)
SELECT count(*), pg_notify($9, '') FROM ins`,

		// One handler at a time: the dispatcher calls it for each of its
		// handlers, so it never reads the rows of a handler it does not run.
		scanHandler: scan(`handler = $2`),

		// keyRows reads, after the keys' locks are held (a fresh snapshot in
		// which every earlier holder's marks are committed), the rows a round
		// needs, in enqueue order: each key's window, its first $2 rows, and
		// the due rows the scan found ($3), which may lie beyond the window,
		// behind a row that is not due. A key costs at most $2 rows however
		// many of its rows wait. The seqs are gathered first (an InitPlan) and
		// the rows fetched by primary key; the last column says whether a row
		// is still to deliver (not published, not dead behind another row,
		// whose blocker decides), and the caller drops the others. Testing
		// that in WHERE would match the partial indexes' predicate, and on a
		// table not analyzed yet the planner would rather scan one of them
		// whole, testing every entry against the seqs.
		keyRows: `SELECT seq, id::text, lock_key, handler, topic, msg_key, value, headers, attempts,
	available_at <= now(), available_at, dead_at IS NOT NULL, created_at,
	published_at IS NULL AND blocked_by IS NULL
FROM ` + t + `
WHERE seq = ANY(ARRAY(
	SELECT w.seq FROM unnest($1::bigint[]) AS k (lock_key)
	CROSS JOIN LATERAL (
		SELECT seq FROM ` + t + `
		WHERE lock_key = k.lock_key AND published_at IS NULL AND blocked_by IS NULL AND handler IS NOT NULL
		ORDER BY seq
		LIMIT $2
	) w
) || $3::bigint[])
ORDER BY seq`,

		markDone: `UPDATE ` + t + ` SET published_at = now(), last_error = NULL
WHERE seq = ANY($1::bigint[])`,

		// markFailed records failures, deferrals and deaths: per row, how
		// many attempts to add, the error, the delay before the next attempt
		// (in microseconds, from now), a floor for available_at, whether it
		// is dead, and the blocker's ID for rows held behind another.
		markFailed: `UPDATE ` + t + ` AS o SET
	attempts = o.attempts + f.add,
	last_error = COALESCE(f.err, o.last_error),
	available_at = GREATEST(o.available_at, now() + f.delay_us * interval '1 microsecond', COALESCE(f.floor, '-infinity')),
	dead_at = CASE WHEN f.dead THEN now() ELSE o.dead_at END,
	blocked_by = f.blocked_by
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::bigint[], $5::timestamptz[], $6::bool[], $7::uuid[])
	AS f (seq, add, err, delay_us, floor, dead, blocked_by)
WHERE o.seq = f.seq AND o.published_at IS NULL`,

		dead: `SELECT id::text, COALESCE(handler, ''), topic, msg_key, attempts, COALESCE(last_error, ''),
	COALESCE(blocked_by::text, ''), created_at, dead_at
FROM ` + t + ` WHERE dead_at IS NOT NULL AND published_at IS NULL
ORDER BY seq
LIMIT $1`,

		// retryLock takes the advisory locks of the keys of the named
		// messages (sorted, so two Retry calls cannot deadlock) and waits for
		// a dispatcher that holds one, then locks the named rows themselves,
		// which waits for a relay that is marking rows dead behind one of them
		// (its block statement holds them FOR SHARE); retry, a later
		// statement of the same transaction, then sees everything they
		// committed, and a relay that comes after sees the rows ready again.
		retryLock: `SELECT pg_advisory_xact_lock(lock_key) FROM (
	SELECT DISTINCT lock_key FROM ` + t + ` WHERE id = ANY($1::uuid[]) AND dead_at IS NOT NULL
	ORDER BY lock_key
) k`,
		retryRows: `SELECT seq FROM ` + t + ` WHERE id = ANY($1::uuid[]) AND dead_at IS NOT NULL ORDER BY seq FOR UPDATE`,
		retry: `UPDATE ` + t + ` SET dead_at = NULL, blocked_by = NULL, waiting = false, attempts = 0, available_at = now()
WHERE published_at IS NULL
  AND (id = ANY($1::uuid[]) AND dead_at IS NOT NULL OR blocked_by = ANY($1::uuid[]))`,

		// stats counts the pending rows through the scans' partial indexes
		// (Kafka rows, handler rows) and the dead rows through theirs.
		stats: `WITH k AS (
	SELECT count(*) AS n, min(created_at) AS oldest FROM ` + t + `
	WHERE published_at IS NULL AND dead_at IS NULL AND handler IS NULL
), h AS (
	SELECT count(*) AS n, min(created_at) AS oldest FROM ` + t + `
	WHERE published_at IS NULL AND dead_at IS NULL AND handler IS NOT NULL
)
SELECT k.n + h.n, COALESCE(EXTRACT(EPOCH FROM now() - LEAST(k.oldest, h.oldest)), 0),
	(SELECT count(*) FROM ` + t + ` WHERE dead_at IS NOT NULL AND published_at IS NULL),
	(SELECT count(*) FROM ` + t + ` WHERE dead_at IS NOT NULL AND published_at IS NULL AND blocked_by IS NOT NULL)
FROM k, h`,

		cleanup: `DELETE FROM ` + t + ` WHERE seq IN (
	SELECT seq FROM ` + t + `
	WHERE published_at IS NOT NULL AND published_at < $1
	ORDER BY published_at
	LIMIT $2
	FOR UPDATE SKIP LOCKED
)`,
	}
}

// storedHeader is one Kafka header as stored in the headers column (jsonb;
// the value is base64, as encoding/json writes []byte).
type storedHeader struct {
	Key   string `json:"k"`
	Value []byte `json:"v"`
}

func validateMessage(i int, m *Message) error {
	bad := func(format string, args ...any) error {
		return &MessageError{Index: i, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case m.Handler == "" && m.Topic == "":
		return bad("Topic is empty and no Handler is set")
	case len(m.Handler) > MaxHandlerLength || !utf8.ValidString(m.Handler) || strings.IndexByte(m.Handler, 0) >= 0:
		return bad("invalid Handler %.32q", m.Handler)
	}
	if m.Handler == "" || m.Topic != "" {
		if err := validateTopic(m.Topic); err != "" {
			return bad("invalid Topic %.64q: %s", m.Topic, err)
		}
	}
	for _, h := range m.Headers {
		switch {
		case h.Key == "":
			return bad("header with an empty key")
		case strings.EqualFold(h.Key, HeaderID):
			return bad("header %q is set by the outbox: it carries the stable ID", HeaderID)
		case !utf8.ValidString(h.Key) || strings.IndexByte(h.Key, 0) >= 0:
			return bad("header key %.32q is not valid UTF-8 or contains NUL", h.Key)
		}
	}
	return nil
}

// validateTopic applies Kafka's rule: 1 to 249 of [a-zA-Z0-9._-], not "." or "..".
func validateTopic(topic string) string {
	if topic == "" || len(topic) > MaxTopicLength {
		return fmt.Sprintf("length %d not in 1..%d", len(topic), MaxTopicLength)
	}
	if topic == "." || topic == ".." {
		return "not allowed by Kafka"
	}
	for _, r := range topic {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return "Kafka topics use only [a-zA-Z0-9._-]"
		}
	}
	return ""
}

// lockKey is the 64-bit advisory lock key of a message's order scope: the
// table, the destination (Kafka topic or handler) and the key. A message
// without a key gets a key of its own (its ID), so it orders with nothing.
func (s *Store) lockKey(m *Message, id string) int64 {
	h := fnv.New64a()
	var n [8]byte
	write := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	write([]byte(s.ident))
	if m.Handler != "" {
		write([]byte("h"))
		write([]byte(m.Handler))
	} else {
		write([]byte("k"))
		write([]byte(m.Topic))
	}
	if len(m.Key) == 0 {
		write([]byte("id"))
		write([]byte(id))
	} else {
		write([]byte("key"))
		write(m.Key)
	}
	return int64(h.Sum64())
}

// EnqueueTx writes msgs to the outbox in tx, with one statement, and returns
// their stable IDs in order. Nothing is delivered unless tx commits; once it
// commits, every message is delivered at least once, carrying its ID. A
// message rejected by validation returns an error matching
// ErrInvalidMessage (a *MessageError) before any SQL runs. No messages do
// nothing.
func (s *Store) EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...Message) ([]string, error) {
	for i := range msgs {
		if err := validateMessage(i, &msgs[i]); err != nil {
			return nil, err
		}
	}
	if tx == nil {
		return nil, errors.New("outbox: enqueue: nil tx")
	}
	if len(msgs) == 0 {
		return []string{}, nil
	}
	var stamped []kafka.Header
	if s.stamp != nil {
		stamped = s.stamp(ctx)
		for _, h := range stamped {
			if h.Key == HeaderID {
				return nil, fmt.Errorf("outbox: enqueue: ContextHeaders returned the header %q, which the relay sets", HeaderID)
			}
		}
	}
	n := len(msgs)
	var (
		ids       = make([]string, n)
		handlers  = make([]pgtype.Text, n)
		topics    = make([]string, n)
		keys      = make([][]byte, n)
		values    = make([][]byte, n)
		headers   = make([][]byte, n) // jsonb, sent as text
		lockKeys  = make([]int64, n)
		notBefore = make([]pgtype.Timestamptz, n)
	)
	for i := range msgs {
		m := &msgs[i]
		id, err := newID()
		if err != nil {
			return nil, fmt.Errorf("outbox: enqueue: %w", err)
		}
		ids[i] = id
		handlers[i] = pgtype.Text{String: m.Handler, Valid: m.Handler != ""}
		topics[i] = m.Topic
		if len(m.Key) > 0 {
			keys[i] = m.Key
		}
		values[i] = m.Value
		if len(m.Headers) > 0 || len(stamped) > 0 {
			hs := make([]storedHeader, len(m.Headers), len(m.Headers)+len(stamped))
			for j, h := range m.Headers {
				hs[j] = storedHeader{Key: h.Key, Value: h.Value}
			}
			for _, h := range stamped {
				if !slices.ContainsFunc(m.Headers, func(o kafka.Header) bool { return o.Key == h.Key }) {
					hs = append(hs, storedHeader{Key: h.Key, Value: h.Value})
				}
			}
			b, err := json.Marshal(hs)
			if err != nil {
				return nil, fmt.Errorf("outbox: enqueue: headers of message %d: %w", i, err)
			}
			headers[i] = b
		}
		lockKeys[i] = s.lockKey(m, id)
		notBefore[i] = pgtype.Timestamptz{Time: m.NotBefore, Valid: !m.NotBefore.IsZero()}
	}
	var inserted int64
	var ignored string
	err := tx.QueryRow(ctx, s.sql.enqueue, ids, handlers, topics, keys, values, jsonbArgs(headers),
		lockKeys, notBefore, s.channel).Scan(&inserted, &ignored)
	if err != nil {
		return nil, fmt.Errorf("outbox: enqueue: %w", translate(err))
	}
	if inserted != int64(n) {
		return nil, fmt.Errorf("outbox: enqueue: inserted %d rows, want %d", inserted, n)
	}
	return ids, nil
}

// jsonbArgs passes raw JSON documents (nil for none) as a text array, which
// PostgreSQL casts to jsonb[].
func jsonbArgs(docs [][]byte) []pgtype.Text {
	out := make([]pgtype.Text, len(docs))
	for i, d := range docs {
		out[i] = pgtype.Text{String: string(d), Valid: d != nil}
	}
	return out
}

// translate maps a missing table to ErrNotMigrated.
func translate(err error) error { return pgexec.NotMigrated(ErrNotMigrated, err) }

// DeadMessage is a message the relay or a dispatcher gave up on, or one
// held behind such a message of the same key.
type DeadMessage struct {
	ID      string
	Handler string // empty for Kafka messages
	Topic   string
	Key     []byte
	// Attempts is how many delivery attempts failed.
	Attempts int
	// Error is the last delivery error.
	Error string
	// BlockedBy is, for a message dead only because a message before it
	// with the same key is dead, that message's ID; empty otherwise.
	BlockedBy  string
	EnqueuedAt time.Time
	DeadAt     time.Time
}

// DeadLimitDefault bounds how many rows Dead returns.
const DeadLimitDefault = 1000

// Dead lists dead messages in enqueue order, at most DeadLimitDefault
// of them: first the ones that failed, interleaved with the ones blocked
// behind them (BlockedBy set).
func (s *Store) Dead(ctx context.Context, db DBTX) ([]DeadMessage, error) {
	rows, err := db.Query(ctx, s.sql.dead, DeadLimitDefault)
	if err != nil {
		return nil, fmt.Errorf("outbox: dead: %w", translate(err))
	}
	var out []DeadMessage
	var p DeadMessage
	_, err = pgx.ForEachRow(rows, []any{&p.ID, &p.Handler, &p.Topic, &p.Key, &p.Attempts, &p.Error,
		&p.BlockedBy, &p.EnqueuedAt, &p.DeadAt}, func() error {
		p.Key = slices.Clone(p.Key)
		out = append(out, p)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: dead: %w", translate(err))
	}
	return out, nil
}

// Retry requeues the named dead messages, and the messages dead behind
// them (BlockedBy one of ids), with their attempts reset: they are delivered
// again in their original order, before any later message of their key. It
// runs in its own READ COMMITTED transaction on db (a savepoint when db is a
// pgx.Tx: then the caller's transaction must be READ COMMITTED too) and
// waits for a dispatcher that is handling one of their keys, or a relay
// that is marking messages dead behind them. It returns how many messages
// it requeued; ErrNotFound when none of ids is dead.
func (s *Store) Retry(ctx context.Context, db TxBeginner, ids ...string) (int64, error) {
	for _, id := range ids {
		if !validID(id) {
			return 0, fmt.Errorf("outbox: retry: %q is not a message ID (a UUID)", id)
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	var n int64
	retry := func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, s.sql.retryLock, ids); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, s.sql.retryRows, ids); err != nil {
			return err
		}
		tag, err := tx.Exec(ctx, s.sql.retry, ids)
		n = tag.RowsAffected()
		return err
	}
	// READ COMMITTED whatever default_transaction_isolation says: the
	// update must see what a relay that held a key committed while Retry
	// waited for its lock (the messages it marked dead behind ours). A pgx.Tx
	// gives a savepoint in the caller's transaction, at the caller's level.
	var err error
	if b, ok := db.(interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}); ok {
		err = pgx.BeginTxFunc(ctx, b, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, retry)
	} else {
		err = pgx.BeginFunc(ctx, db, retry)
	}
	if err != nil {
		return 0, fmt.Errorf("outbox: retry: %w", translate(err))
	}
	if n == 0 {
		return 0, ErrNotFound
	}
	return n, nil
}

// Stats is a snapshot of the outbox table.
type Stats struct {
	// Backlog is the number of messages not yet delivered and not dead.
	Backlog int64
	// OldestAge is how long the oldest of them has waited, by the database
	// clock; zero when Backlog is zero.
	OldestAge time.Duration
	// Dead is the number of dead messages: those that failed for good,
	// and the later messages of their keys, held behind them.
	Dead int64
	// Held is how many of Dead are held behind an earlier dead message of
	// their key rather than for a failure of their own: they are published
	// once that message is retried (Retry) and published.
	Held int64
}

// Stats counts the backlog, the dead messages and, of those, the ones
// held behind an earlier message of their key, in one statement.
func (s *Store) Stats(ctx context.Context, db DBTX) (Stats, error) {
	var st Stats
	var age float64
	if err := db.QueryRow(ctx, s.sql.stats).Scan(&st.Backlog, &age, &st.Dead, &st.Held); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", translate(err))
	}
	st.OldestAge = time.Duration(age * float64(time.Second))
	return st, nil
}

// Cleanup deletes messages delivered more than olderThan ago (by the database
// clock, fixed when Cleanup starts), at most batchSize rows per statement,
// each statement its own short transaction, until none is left or ctx ends.
// It returns how many rows it deleted, also with an error. batchSize <= 0
// means CleanupBatchDefault. Undelivered and dead messages are never
// deleted.
func (s *Store) Cleanup(ctx context.Context, db DBTX, olderThan time.Duration, batchSize int) (int64, error) {
	if olderThan < 0 {
		return 0, fmt.Errorf("outbox: cleanup: olderThan %v is negative", olderThan)
	}
	if batchSize <= 0 {
		batchSize = CleanupBatchDefault
	}
	var cutoff time.Time
	if err := db.QueryRow(ctx, `SELECT now() - $1::bigint * interval '1 microsecond'`,
		olderThan.Microseconds()).Scan(&cutoff); err != nil {
		return 0, fmt.Errorf("outbox: cleanup: %w", err)
	}
	deleted, err := pgexec.DeleteInBatches(ctx, db, s.sql.cleanup, batchSize, cutoff)
	if err != nil {
		return deleted, fmt.Errorf("outbox: cleanup: %w", translate(err))
	}
	return deleted, nil
}
