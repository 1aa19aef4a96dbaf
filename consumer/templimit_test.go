package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// TestTempFileLimitIsAnAttempt: a message whose handler's query
// exceeds temp_file_limit gets ERROR 53400 (configuration_limit_exceeded)
// on a connection that stays open. It fails the same way on every run: the
// message's verdict, charged as an attempt and given to OnFailure. SQLSTATE
// class 53 is a "connection" class for retry.IsConnection, yet the
// connection is alive: a runner that took it for an outage would run the
// message again for ever, never charge an attempt, leave the partition
// stuck and report a PostgreSQL outage that is not one.
func TestTempFileLimitIsAnAttempt(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("huge", "k", 1), msg("next", "k", 1))
			var calls atomic.Int32
			cfg := e.config(md, nil)
			cfg.Retry = retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2}
			cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == "huge" {
					calls.Add(1)
					if _, err := tx.Exec(ctx, `SET LOCAL work_mem = '64kB'`); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `SET LOCAL temp_file_limit = '1kB'`); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `SELECT count(*) FROM (SELECT g FROM generate_series(1, 200000) g ORDER BY g DESC) s`)
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
			if failed.Load() != 1 || outages.Load() != 0 {
				t.Fatalf("%d handler calls, %d to OnFailure, %d outages; want 1 to OnFailure, no outage", calls.Load(), failed.Load(), outages.Load())
			}
		})
	}
}
