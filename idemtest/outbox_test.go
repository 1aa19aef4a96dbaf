package idemtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/idemtest"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// TestEnqueuedTx: RequireEnqueuedTx sees what this transaction enqueued,
// savepoints included, and nothing another transaction enqueued, committed
// or not; it reports a missing, an extra or a different message.
func TestEnqueuedTx(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := idemtest.NewSchema(t, pool)
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	enqueue := func(tx pgx.Tx, msgs ...outbox.Message) {
		t.Helper()
		if _, err := store.EnqueueTx(ctx, tx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	// Another transaction's messages: one committed, one in flight.
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		enqueue(tx, outbox.Message{Topic: "orders", Value: []byte("other, committed")})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(context.WithoutCancel(ctx))
	enqueue(other, outbox.Message{Topic: "orders", Value: []byte("other, in flight")})

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	later := time.Now().Add(time.Hour)
	paid := outbox.Message{Topic: "orders", Key: []byte("order-1"), Value: []byte(`{"paid":true}`),
		Headers: []kafka.Header{{Key: "type", Value: []byte("OrderPaid")}}}
	mail := outbox.Message{Handler: "email", Key: []byte("order-1"), Value: []byte("receipt"), NotBefore: later}
	enqueue(tx, paid)
	sp, err := tx.Begin(ctx) // a savepoint
	if err != nil {
		t.Fatal(err)
	}
	enqueue(sp, mail)
	if err := sp.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got := idemtest.RequireEnqueuedTx(ctx, t, tx, store, paid, mail)
	if got[0].ID == "" || got[1].Seq <= got[0].Seq {
		t.Fatalf("enqueued %+v: want IDs and enqueue order", got)
	}

	requireReported(t, report(t, func(tb testing.TB) { idemtest.RequireEnqueuedTx(ctx, tb, tx, store, paid) }),
		"2 outbox messages enqueued the transaction, want 1")
	changed := paid
	changed.Value = []byte(`{"paid":false}`)
	requireReported(t, report(t, func(tb testing.TB) { idemtest.RequireEnqueuedTx(ctx, tb, tx, store, changed, mail) }),
		`outbox message 0 enqueued the transaction: value "{\"paid\":true}", want "{\"paid\":false}"`)
	header := paid
	header.Headers = []kafka.Header{{Key: "type", Value: []byte("OrderShipped")}}
	requireReported(t, report(t, func(tb testing.TB) { idemtest.RequireEnqueuedTx(ctx, tb, tx, store, header, mail) }),
		`no header type="OrderShipped"`)
	sooner := mail
	sooner.NotBefore = later.Add(-time.Minute)
	requireReported(t, report(t, func(tb testing.TB) { idemtest.RequireEnqueuedTx(ctx, tb, tx, store, paid, sooner) }),
		"not before")
}

// TestEnqueuedSince: a consumer handler that enqueues an event in its
// transaction enqueues it once, whatever the redeliveries; the kit reads
// what committed since a mark.
func TestEnqueuedSince(t *testing.T) {
	t.Parallel()
	p := newPayments(t)
	ob, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: p.schema.Name}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	mark, err := idemtest.MarkOutbox(ctx, p.pool, ob)
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemtest.NewConsumer(p.pool, &consumer.Config{Store: p.store,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: "receipts", Key: m.Key, Value: m.Value})
			return err
		})})
	if err != nil {
		t.Fatal(err)
	}
	events := func(ctx context.Context) (int, error) {
		got, err := idemtest.EnqueuedSince(ctx, p.pool, mark)
		return len(got), err
	}
	idemtest.RequireRecovers(ctx, t, c, idemtest.CrashBeforeCommit, payment("pay-1", 1), events)
	idemtest.RequireEnqueuedSince(ctx, t, p.pool, mark, outbox.Message{Topic: "receipts", Key: []byte("acct-1"), Value: []byte("pay-1")})
	requireReported(t, report(t, func(tb testing.TB) { idemtest.RequireEnqueuedSince(ctx, tb, p.pool, mark) }),
		"1 outbox messages enqueued since the mark, want 0")
}
