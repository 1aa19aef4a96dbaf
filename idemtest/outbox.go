package idemtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/outbox"
)

// Enqueued is a message read back from an outbox table.
type Enqueued struct {
	// ID is the stable ID EnqueueTx returned (the relay's message-id header).
	ID string
	// Message is the message as given to EnqueueTx, with the headers of the
	// store's ContextHeaders added; NotBefore is set when the row was
	// enqueued to wait (its available time is later than its creation).
	outbox.Message
	// Seq is the row's place in enqueue order.
	Seq int64
}

// outboxColumns are read by scanEnqueued, in its order.
const outboxColumns = `seq, id::text, coalesce(handler, ''), topic, msg_key, value, headers, created_at, available_at`

func scanEnqueued(rows pgx.Rows) ([]Enqueued, error) {
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Enqueued, error) {
		var e Enqueued
		var headers []byte
		var created, available time.Time
		if err := row.Scan(&e.Seq, &e.ID, &e.Handler, &e.Topic, &e.Key, &e.Value, &headers, &created, &available); err != nil {
			return e, err
		}
		if available.After(created) {
			e.NotBefore = available
		}
		if len(headers) > 0 {
			var hs []struct {
				Key   string `json:"k"`
				Value []byte `json:"v"`
			}
			if err := json.Unmarshal(headers, &hs); err != nil {
				return e, fmt.Errorf("headers of outbox message %s: %w", e.ID, err)
			}
			for _, h := range hs {
				e.Headers = append(e.Headers, kafka.Header{Key: h.Key, Value: h.Value})
			}
		}
		return e, nil
	})
}

// EnqueuedTx returns the messages tx enqueued in store's table, savepoints
// included, in enqueue order: the rows tx can see whose inserting
// transaction is tx (or one of its subtransactions). Messages enqueued by
// other transactions, committed or not, are not returned.
func EnqueuedTx(ctx context.Context, tx pgx.Tx, store *outbox.Store) ([]Enqueued, error) {
	if tx == nil || store == nil {
		return nil, fmt.Errorf("idemtest: enqueued: nil tx or store")
	}
	// xmin is a 32-bit transaction ID; pg_xact_status wants the 64-bit
	// one: take the current transaction's epoch, moved by one when xmin is
	// more than 2^31 away from it. A row tx can see whose inserter is still
	// in progress was inserted by tx.
	rows, err := tx.Query(ctx, `WITH cur AS (SELECT pg_current_xact_id()::text::bigint AS x)
SELECT `+outboxColumns+` FROM `+store.Table()+`, cur
WHERE pg_xact_status((cur.x + (((xmin::text::bigint - (cur.x & 4294967295)) + 2147483648) % 4294967296 + 4294967296) % 4294967296 - 2147483648)::text::xid8) = 'in progress'
ORDER BY seq`)
	if err != nil {
		return nil, fmt.Errorf("idemtest: read the outbox of the transaction: %w", err)
	}
	out, err := scanEnqueued(rows)
	if err != nil {
		return nil, fmt.Errorf("idemtest: read the outbox of the transaction: %w", err)
	}
	return out, nil
}

// OutboxMark is a point in an outbox table's enqueue order: EnqueuedSince
// returns what was enqueued after it.
type OutboxMark struct {
	store *outbox.Store
	seq   int64
}

// MarkOutbox returns the point after the last message of store's table that
// db sees. Take it before the code under test runs, in a test that is alone
// on the table (a fresh schema per test).
func MarkOutbox(ctx context.Context, db outbox.DBTX, store *outbox.Store) (OutboxMark, error) {
	if db == nil || store == nil {
		return OutboxMark{}, fmt.Errorf("idemtest: mark the outbox: nil db or store")
	}
	m := OutboxMark{store: store}
	if err := db.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM `+store.Table()).Scan(&m.seq); err != nil {
		return m, fmt.Errorf("idemtest: mark the outbox: %w", err)
	}
	return m, nil
}

// EnqueuedSince returns the messages of the mark's table that db sees and
// that were enqueued after the mark, in enqueue order, published or not.
// Read on a pool, that is what committed: what a handler run through
// Consumer.Deliver enqueued, for example. Rows deleted by a relay's
// retention are gone.
func EnqueuedSince(ctx context.Context, db outbox.DBTX, mark OutboxMark) ([]Enqueued, error) {
	if db == nil || mark.store == nil {
		return nil, fmt.Errorf("idemtest: enqueued since: nil db, or a mark not from MarkOutbox")
	}
	rows, err := db.Query(ctx, `SELECT `+outboxColumns+` FROM `+mark.store.Table()+` WHERE seq > $1 ORDER BY seq`, mark.seq)
	if err != nil {
		return nil, fmt.Errorf("idemtest: read the outbox since the mark: %w", err)
	}
	out, err := scanEnqueued(rows)
	if err != nil {
		return nil, fmt.Errorf("idemtest: read the outbox since the mark: %w", err)
	}
	return out, nil
}

// RequireEnqueuedTx checks that tx enqueued exactly the messages want in
// store's table, in that order (see EnqueuedTx), and returns them. A message
// matches its want when Topic, Handler, Key and Value are equal, every
// header of want is there with its value (other headers, such as those of
// ContextHeaders, may be added), and NotBefore, when want has one, is equal
// to the microsecond. Failures are reported with tb.Errorf, listing what was
// enqueued; a failed read stops the test.
func RequireEnqueuedTx(ctx context.Context, tb testing.TB, tx pgx.Tx, store *outbox.Store, want ...outbox.Message) []Enqueued {
	tb.Helper()
	got, err := EnqueuedTx(ctx, tx, store)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	requireEnqueued(tb, "the transaction", got, want)
	return got
}

// RequireEnqueuedSince is RequireEnqueuedTx for what db sees enqueued after
// mark (see EnqueuedSince): on a pool, what committed.
func RequireEnqueuedSince(ctx context.Context, tb testing.TB, db outbox.DBTX, mark OutboxMark, want ...outbox.Message) []Enqueued {
	tb.Helper()
	got, err := EnqueuedSince(ctx, db, mark)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	requireEnqueued(tb, "since the mark", got, want)
	return got
}

func requireEnqueued(tb testing.TB, where string, got []Enqueued, want []outbox.Message) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Errorf("idemtest: %d outbox messages enqueued %s, want %d:\n%s", len(got), where, len(want), listEnqueued(got))
		return
	}
	for i := range want {
		if why := mismatch(&got[i].Message, &want[i]); why != "" {
			tb.Errorf("idemtest: outbox message %d enqueued %s: %s\n%s", i, where, why, listEnqueued(got))
		}
	}
}

// mismatch says how got differs from want, or "" when it matches.
func mismatch(got, want *outbox.Message) string {
	switch {
	case got.Topic != want.Topic:
		return fmt.Sprintf("topic %q, want %q", got.Topic, want.Topic)
	case got.Handler != want.Handler:
		return fmt.Sprintf("handler %q, want %q", got.Handler, want.Handler)
	case !bytes.Equal(got.Key, want.Key):
		return fmt.Sprintf("key %q, want %q", got.Key, want.Key)
	case !bytes.Equal(got.Value, want.Value):
		return fmt.Sprintf("value %q, want %q", got.Value, want.Value)
	case !want.NotBefore.IsZero() && !got.NotBefore.Equal(want.NotBefore.Truncate(time.Microsecond)):
		return fmt.Sprintf("not before %s, want %s", got.NotBefore, want.NotBefore)
	}
	for _, w := range want.Headers {
		found := false
		for _, h := range got.Headers {
			if h.Key == w.Key && bytes.Equal(h.Value, w.Value) {
				found = true
				break
			}
		}
		if !found {
			return fmt.Sprintf("no header %s=%q", w.Key, w.Value)
		}
	}
	return ""
}

func listEnqueued(es []Enqueued) string {
	if len(es) == 0 {
		return "\t(none)"
	}
	var b strings.Builder
	for i, e := range es {
		dest := "topic " + e.Topic
		if e.Handler != "" {
			dest = "handler " + e.Handler
		}
		fmt.Fprintf(&b, "\t%d: %s, key %q, value %q, %d headers, ID %s\n", i, dest, e.Key, e.Value, len(e.Headers), e.ID)
	}
	return strings.TrimSuffix(b.String(), "\n")
}
