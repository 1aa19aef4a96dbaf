package idemtest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemtest"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// The tests below are written as a service's own tests would be (quoted by
// docs/testing.md): a pool on the test database, a fresh schema, the
// production consumer.Config, and the kit's checks.

// markPaid is the service's code under test: the business write and the
// OrderPaid event, in the caller's transaction.
func markPaid(ctx context.Context, tx pgx.Tx, events *outbox.Store, orders, orderID string) error {
	if _, err := tx.Exec(ctx, `UPDATE `+orders+` SET status = 'paid' WHERE id = $1`, orderID); err != nil {
		return err
	}
	_, err := events.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Key: []byte(orderID), Value: []byte(`{"status":"paid"}`)})
	return err
}

func TestExample_paymentHandler(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), os.Getenv("IDEMKIT_TEST_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := idemtest.NewSchema(t, pool) // idemkit's tables in a fresh schema, dropped when the test ends
	charges := s.Table("charges")
	if _, err := pool.Exec(t.Context(), `CREATE TABLE `+charges+` (id text PRIMARY KEY, amount bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemtest.NewConsumer(pool, &consumer.Config{Store: store, Name: "billing", IDFunc: consumer.IDFromJSON("event_id"),
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+charges+` (id, amount) VALUES ($1, 100)`, msg.ID)
			return err
		})})
	if err != nil {
		t.Fatal(err)
	}
	charged := func(ctx context.Context) (int64, error) { // the effect, as committed
		var sum int64
		err := pool.QueryRow(ctx, `SELECT coalesce(sum(amount), 0)::bigint FROM `+charges).Scan(&sum)
		return sum, err
	}
	payment := func(id string, offset int64) kafka.Message {
		return kafka.Message{Offset: offset, Key: []byte("order-1"), Value: []byte(`{"event_id":"` + id + `"}`)}
	}

	idemtest.RequireIdempotent(t.Context(), t, c, payment("pay-1", 10), charged)
	for i, crash := range idemtest.CrashPoints() {
		idemtest.RequireRecovers(t.Context(), t, c, crash, payment(fmt.Sprint("pay-crash-", i), int64(20+10*i)), charged)
	}
}

func TestExample_orderEvents(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), os.Getenv("IDEMKIT_TEST_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := idemtest.NewSchema(t, pool)
	orders := s.Table("orders")
	if _, err := pool.Exec(t.Context(), `CREATE TABLE `+orders+` (id text PRIMARY KEY, status text NOT NULL);
		INSERT INTO `+orders+` VALUES ('order-42', 'open'), ('order-43', 'open')`); err != nil {
		t.Fatal(err)
	}
	events, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		t.Fatal(err)
	}

	// What one transaction enqueued, read inside it before it commits.
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(t.Context()))
	if err := markPaid(t.Context(), tx, events, orders, "order-42"); err != nil {
		t.Fatal(err)
	}
	idemtest.RequireEnqueuedTx(t.Context(), t, tx, events,
		outbox.Message{Topic: "orders", Key: []byte("order-42"), Value: []byte(`{"status":"paid"}`)})

	// What a handler run through the consumer's transaction committed.
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := idemtest.NewConsumer(pool, &consumer.Config{Store: store, Name: "order-service",
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			return markPaid(ctx, tx, events, orders, string(msg.Key))
		})})
	if err != nil {
		t.Fatal(err)
	}
	mark, err := idemtest.MarkOutbox(t.Context(), pool, events)
	if err != nil {
		t.Fatal(err)
	}
	// One batch, one transaction: the message, then a producer's retry of it
	// (a duplicate: nothing more is enqueued).
	msg := kafka.Message{Offset: 7, Key: []byte("order-43"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("pay-43")}}}
	retry := msg
	retry.Offset = 8
	if _, err := c.Deliver(t.Context(), msg, retry); err != nil {
		t.Fatal(err)
	}
	idemtest.RequireEnqueuedSince(t.Context(), t, pool, mark,
		outbox.Message{Topic: "orders", Key: []byte("order-43"), Value: []byte(`{"status":"paid"}`)})
}

func TestExample_paymentsEndpoint(t *testing.T) {
	pool, err := pgxpool.New(t.Context(), os.Getenv("IDEMKIT_TEST_DATABASE_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s := idemtest.NewSchema(t, pool)
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(pool, &idemhttp.Config{Store: store,
		FingerprintKeys: [][]byte{[]byte("a test secret of at least thirty-two bytes")},
		Account:         func(r *http.Request) (string, error) { return "acct-1", nil }})
	if err != nil {
		t.Fatal(err)
	}
	payments := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"status":"created"}`)
	})
	counted, runs := idemtest.CountRuns(payments) // inside the middleware: replays do not reach it
	newRequest := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(idemhttp.HeaderKey, "8e03978e-40d5-43e8-bc93-6894a57f9324")
		return r
	}
	first, replay := idemtest.RequireReplay(t.Context(), t, mw.Handler(counted), newRequest, runs)
	if first.StatusCode != http.StatusCreated || replay.StatusCode != http.StatusCreated {
		t.Fatalf("answers %d and %d, want 201 twice", first.StatusCode, replay.StatusCode)
	}
}
