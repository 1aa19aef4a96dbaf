package consumer_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// TestHandlerOwnNetworkErrorIsAnAttempt (guards connectionLost): a
// handler's own network error — its call to another service is refused —
// on a healthy PostgreSQL connection is the handler's verdict: retried
// under Retry, then OnFailure. It must not be taken for a PostgreSQL
// outage (waited out for ever, never charged) just because
// retry.IsConnection recognises a network error: connectionLost must look at
// the state of the transaction's connection before it asks IsConnection.
func TestHandlerOwnNetworkErrorIsAnAttempt(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("ext", "k", 1), msg("next", "k", 1))
			var calls atomic.Int32
			cfg := e.config(md, nil)
			cfg.Retry = retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2}
			cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == "ext" {
					calls.Add(1)
					c, err := net.DialTimeout("tcp", "127.0.0.1:1", time.Second) // the payment provider is down
					if err == nil {
						c.Close()
					}
					return err
				}
				return e.effect(ctx, tx, m)
			})
			var failed, outages atomic.Int32
			cfg.OnFailure = func(context.Context, *consumer.Message, error) error { failed.Add(1); return nil }
			testobs.Of(cfg).OnOutageStarted = func(string, error) { outages.Add(1) }
			oc := newOutcomes(2)
			testobs.Of(cfg).OnOutcome = oc.hook
			stop := run(t, e.db.Pool, cfg)
			select {
			case <-oc.done:
			case <-time.After(20 * time.Second):
				t.Fatalf("after 20s: %d handler calls, %d to OnFailure, %d outages reported; Run: %v",
					calls.Load(), failed.Load(), outages.Load(), stop())
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if calls.Load() != 2 || failed.Load() != 1 || outages.Load() != 0 {
				t.Fatalf("%d handler calls, %d to OnFailure, %d outages; want 2, 1, 0", calls.Load(), failed.Load(), outages.Load())
			}
		})
	}
}
