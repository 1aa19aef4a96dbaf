package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

// A receipt e-mail and a reminder a day later, enqueued with the order in
// one transaction; a Dispatcher sends them after the commit, passing the
// stable ID to the mail provider as its idempotency key.
func ExampleNewDispatcher() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := outbox.New(nil) // idemkit's tables in schema public
	if err != nil {
		log.Fatal(err)
	}

	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the order's rows, in tx ...
		_, err := store.EnqueueTx(ctx, tx,
			outbox.Message{Handler: "send-mail", Key: []byte("order-42"), Value: []byte(`{"template":"receipt"}`)},
			outbox.Message{Handler: "send-mail", Key: []byte("order-42"), Value: []byte(`{"template":"reminder"}`),
				NotBefore: time.Now().Add(24 * time.Hour)}, // holds the later messages of order-42 too
		)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}

	d, err := outbox.NewDispatcher(pool, store, &outbox.DispatcherConfig{
		Handlers: map[string]outbox.Handler{
			"send-mail": outbox.HandlerFunc(func(ctx context.Context, rec *outbox.Record) error {
				err := sendMail(ctx, rec.ID, rec.Value) // rec.ID: the provider's idempotency key
				if errors.Is(err, errBadAddress) {
					return retry.Permanent(err) // dead at once: `idemkit outbox dead` shows it
				}
				return err // retried with backoff, Retry.MaxAttempts times, then dead
			}),
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := d.Run(ctx); err != nil { // until ctx ends
		log.Fatal(err)
	}
}

var errBadAddress = errors.New("bad address")

func sendMail(ctx context.Context, idempotencyKey string, body []byte) error { return nil }

// The outbox's health from Go: the backlog, the dead messages with their
// errors, and a requeue once the cause is fixed (`idemkit outbox stats`,
// `dead` and `retry` from a shell).
func ExampleStore_Dead() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := outbox.New(nil)
	if err != nil {
		log.Fatal(err)
	}
	st, err := store.Stats(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("backlog", st.Backlog, "oldest", st.OldestAge, "dead", st.Dead, "held behind them", st.Held)

	dead, err := store.Dead(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	var failed []string
	for _, m := range dead {
		if m.BlockedBy == "" { // failed itself; the others wait behind one of these
			fmt.Println(m.ID, m.Topic, m.Attempts, "attempts:", m.Error)
			failed = append(failed, m.ID)
		}
	}
	// ... the cause fixed (the topic created, the message made smaller) ...
	n, err := store.Retry(ctx, pool, failed...) // requeued with those behind them, in order
	if err != nil && !errors.Is(err, outbox.ErrNotFound) {
		log.Fatal(err)
	}
	fmt.Println(n, "requeued")
}
