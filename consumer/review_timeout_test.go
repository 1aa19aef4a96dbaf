package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/retry"
)

// TestReviewHandlerTimeoutIsAnAttempt: a handler bounds its own statement
// with a context deadline (a common pattern: "this lookup may take 100ms at
// most") and returns the timeout. pgx closes a connection whose statement's
// context expired, so since c387227 connectionLost takes the handler's own
// timeout for a lost connection: an outage, waited out for ever (MaxOutage
// defaults to 0), never charged to the message, never handed to OnFailure.
// The partition is stuck behind one slow message and the runner reports a
// PostgreSQL outage that is not one. Before c387227 the handler's verdict
// was kept and the message went through the retry policy to OnFailure.
func TestReviewHandlerTimeoutIsAnAttempt(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("slow", "k", 1), msg("next", "k", 1))
			var calls atomic.Int32
			cfg := e.config(md, nil)
			cfg.Retry = &retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2}
			cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == "slow" {
					calls.Add(1)
					qctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
					defer cancel()
					_, err := tx.Exec(qctx, `SELECT pg_sleep(2)`)
					return err
				}
				return e.effect(ctx, tx, m)
			})
			var failed atomic.Int32
			cfg.OnFailure = func(context.Context, *consumer.Message, error) error { failed.Add(1); return nil }
			var outages atomic.Int32
			cfg.Hooks.OutageStarted = func(string, error) { outages.Add(1) }
			oc := newOutcomes(2)
			cfg.Hooks.Outcome = oc.hook
			stop := run(t, cfg)
			select {
			case <-oc.done:
			case <-time.After(20 * time.Second):
				t.Fatalf("FAILS: after 20s the slow message is not given up: %d handler calls, %d to OnFailure, %d outages reported (its own timeout is waited out as a PostgreSQL outage)",
					calls.Load(), failed.Load(), outages.Load())
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if failed.Load() != 1 || calls.Load() != 2 {
				t.Fatalf("%d handler calls, %d to OnFailure; want 2 and 1", calls.Load(), failed.Load())
			}
		})
	}
}
