package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// TestHandlerConnectionLossIsNotAnAttempt: the connection of a message's
// transaction dies under its handler (pg_terminate_backend, as a PostgreSQL
// restart does). That is an outage, not the handler's verdict: the runner
// waits it out and runs the transaction again without charging the message
// an attempt (worker.connectionLost's contract). With MaxAttempts 1 and no
// OnFailure, charging it an attempt stops Run with a *MessageError. A kill
// that lands in a handler must be reported as an outage, not logged as
// "handler failed; retrying".
func TestHandlerConnectionLossIsNotAnAttempt(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("m1", "k", 1), msg("m2", "k", 1))
			var calls atomic.Int32
			cfg := e.config(md, nil)
			cfg.Retry = retry.Policy{MaxAttempts: 1} // an attempt charged is the message's last
			cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == "m1" && calls.Add(1) == 1 {
					_, err := tx.Exec(ctx, `SELECT pg_terminate_backend(pg_backend_pid())`)
					if err == nil {
						err = errors.New("test setup: the backend survived pg_terminate_backend")
					}
					return err
				}
				return e.effect(ctx, tx, m)
			})
			var outages atomic.Int32
			testobs.Of(cfg).OnOutageStarted = func(string, error) { outages.Add(1) }
			oc := newOutcomes(2)
			testobs.Of(cfg).OnOutcome = oc.hook
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			select {
			case err := <-errc:
				t.Fatalf("Run returned %v after %d handler calls for m1: the lost connection was charged as an attempt", err, calls.Load())
			case <-oc.done:
			case <-time.After(60 * time.Second):
				t.Fatal("m1 and m2 not applied")
			}
			cancel()
			if err := <-errc; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if runs := e.runs(); runs["m1"] != 1 || runs["m2"] != 1 {
				t.Fatalf("effects %v, want m1 and m2 once", runs)
			}
			if outages.Load() == 0 {
				t.Fatal("the lost connection was not reported as an outage")
			}
		})
	}
}
