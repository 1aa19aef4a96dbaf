package consumer

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/pgexec"
)

// ParkedQuery selects the messages a consumer parked in NonBlocking mode
// (see NonBlocking), for ListParked and RetryParked.
type ParkedQuery struct {
	// Consumer is the consumer's Config.Name (required).
	Consumer string
	// Topic is the topic it consumes (required).
	Topic string
	// Partitions selects these partitions only. Defaults to nil: all.
	Partitions []int
	// Keys selects the messages with these keys only (a message without a
	// key has the empty key). Defaults to nil: every key.
	Keys [][]byte
	// Limit bounds the messages ListParked returns (RetryParked ignores
	// it). Defaults to ParkedListLimitDefault.
	Limit int
}

// ParkedListLimitDefault is ListParked's default ParkedQuery.Limit.
const ParkedListLimitDefault = 1000

// ParkedMessage is a message parked by a consumer in NonBlocking mode.
type ParkedMessage struct {
	Consumer    string
	Topic       string
	Partition   int
	Incarnation int64 // the topic's incarnation (see Message.Incarnation)
	Offset      int64
	Key         []byte
	MessageID   string
	Value       []byte
	Headers     []kafka.Header
	Time        time.Time // the record's timestamp; zero when not known
	// Head is true for the first parked message of its key (in incarnation
	// and offset order): the one the runner attempts. The others wait
	// behind it and are released after it, in order.
	Head bool
	// Behind is, for a head, how many messages of its key wait behind it.
	Behind int
	// Attempts, FirstFailure, LastFailure and LastError describe the head's
	// failures so far; a message parked behind its head has none.
	Attempts     int
	FirstFailure time.Time
	LastFailure  time.Time
	LastError    string
	// NextAttempt is when the runner attempts the head again (a message
	// behind its head follows it at once).
	NextAttempt time.Time
	// Due is true when NextAttempt has come by the database's clock, the
	// one the runner goes by (not the caller's).
	Due      bool
	ParkedAt time.Time
}

// RetriedParked is a head RetryParked made due: Message with NextAttempt
// as it is now, and Before, when it was due before.
type RetriedParked struct {
	ParkedMessage
	Before time.Time
}

func (q *ParkedQuery) validate(op string) error {
	if err := dedup.ValidateID("Consumer", q.Consumer); err != nil {
		return fmt.Errorf("consumer: %s: %w", op, err)
	}
	if q.Topic == "" {
		return fmt.Errorf("consumer: %s: empty topic", op)
	}
	for _, p := range q.Partitions {
		if p < 0 {
			return fmt.Errorf("consumer: %s: negative partition %d", op, p)
		}
	}
	if q.Limit < 0 {
		return fmt.Errorf("consumer: %s: negative Limit %d", op, q.Limit)
	}
	return nil
}

func (q *ParkedQuery) args() []any {
	var parts []int32
	if q.Partitions != nil {
		parts = make([]int32, len(q.Partitions))
		for i, p := range q.Partitions {
			parts[i] = int32(p)
		}
	}
	var keys [][]byte
	if q.Keys != nil {
		keys = make([][]byte, len(q.Keys))
		for i, k := range q.Keys {
			keys[i] = keyBytes(k)
		}
	}
	return []any{q.Consumer, q.Topic, parts, keys}
}

// ListParked returns the messages the consumer parked on the topic (its
// NonBlocking mode), in partition, incarnation and offset order, at most
// q.Limit of them; each key's head is marked. It only reads. store names the
// tables (the consumer's Config.Store). A schema without the parked table
// (not migrated) returns an error matching ErrNotMigrated.
func ListParked(ctx context.Context, db dedup.DBTX, store *dedup.Store, q ParkedQuery) ([]ParkedMessage, error) {
	if err := q.validate("list parked"); err != nil {
		return nil, err
	}
	limit := q.Limit
	if limit == 0 {
		limit = ParkedListLimitDefault
	}
	rows, err := db.Query(ctx, newParkSQL(store.Tables()).list, append(q.args(), limit)...)
	if err != nil {
		return nil, parkedErr("list parked", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ParkedMessage, error) {
		var pm ParkedMessage
		var behind int64
		err := scanParked(row, &pm, &pm.Head, &behind, &pm.Due)
		if !pm.Head {
			behind = 0
		}
		pm.Behind = int(behind)
		return pm, err
	})
	if err != nil {
		return nil, parkedErr("list parked", err)
	}
	return out, nil
}

// RetryParked makes the head of every selected key due now, so that the
// consumer's runner attempts it at its next look for due parked messages
// (Config.ParkedPoll) instead of waiting for the time ParkedRetry gave it.
// It only reschedules: the runner still releases each key strictly in
// offset order, the head first, through dedup and the handler; nothing is
// skipped, removed or attempted here, and attempts are not reset (a head
// whose ParkedRetry is used up goes to OnFailure when it fails again). A
// head already due is returned unchanged; a head the runner is releasing
// at that moment keeps the runner's verdict. It returns the selected heads
// in partition and key order; none, when nothing is parked there. Run it in
// a transaction and roll back to see what it would do. A schema without the
// parked table (not migrated) returns an error matching ErrNotMigrated.
func RetryParked(ctx context.Context, db dedup.DBTX, store *dedup.Store, q ParkedQuery) ([]RetriedParked, error) {
	if err := q.validate("retry parked"); err != nil {
		return nil, err
	}
	// The heads are found and updated by their primary key in one statement;
	// now() is the database clock, as next_attempt_at's default.
	rows, err := db.Query(ctx, newParkSQL(store.Tables()).retry, q.args()...)
	if err != nil {
		return nil, parkedErr("retry parked", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RetriedParked, error) {
		var r RetriedParked
		var behind int64
		err := scanParked(row, &r.ParkedMessage, &behind, &r.Before, &r.Due)
		r.Head, r.Behind = true, int(behind)
		return r, err
	})
	if err != nil {
		return nil, parkedErr("retry parked", err)
	}
	// RETURNING has no order.
	slices.SortFunc(out, func(a, b RetriedParked) int {
		return cmp.Or(cmp.Compare(a.Partition, b.Partition), bytes.Compare(a.Key, b.Key))
	})
	return out, nil
}

// scanParked scans parkedColumns into pm, then extra.
func scanParked(row pgx.Row, pm *ParkedMessage, extra ...any) error {
	var (
		js                 []byte
		mtime, first, last *time.Time
		lastErr            *string
	)
	dst := append([]any{&pm.Consumer, &pm.Topic, &pm.Partition, &pm.Incarnation, &pm.Offset, &pm.Key, &pm.MessageID,
		&pm.Value, &js, &mtime, &pm.Attempts, &first, &last, &lastErr, &pm.NextAttempt, &pm.ParkedAt}, extra...)
	if err := row.Scan(dst...); err != nil {
		return err
	}
	var hs []header
	if err := json.Unmarshal(js, &hs); err != nil {
		return fmt.Errorf("parked headers: %w", err)
	}
	for _, h := range hs {
		k := h.Key
		if h.KeyBytes != nil {
			k = string(h.KeyBytes)
		}
		pm.Headers = append(pm.Headers, kafka.Header{Key: k, Value: h.Value})
	}
	if mtime != nil {
		pm.Time = *mtime
	}
	if first != nil {
		pm.FirstFailure = *first
	}
	if last != nil {
		pm.LastFailure = *last
	}
	if lastErr != nil {
		pm.LastError = *lastErr
	}
	return nil
}

// parkedErr wraps err for op, marking a schema that is not migrated.
func parkedErr(op string, err error) error {
	return fmt.Errorf("consumer: %s: %w", op, pgexec.NotMigrated(ErrNotMigrated, err))
}
