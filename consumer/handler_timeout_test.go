package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// TestHandlerTimeoutIsAnAttempt: a handler bounds its own statement
// with a context deadline (a common pattern: "this lookup may take 100ms at
// most") and returns the timeout. pgx closes a connection whose statement's
// context expired, yet the timeout is the handler's verdict: the message goes
// through the retry policy to OnFailure. Taken for a lost connection, it
// would be an outage waited out for ever (MaxOutage defaults to 0), never
// charged to the message: the partition stuck behind one slow message and a
// PostgreSQL outage reported that is not one.
func TestHandlerTimeoutIsAnAttempt(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("slow", "k", 1), msg("next", "k", 1))
			var calls atomic.Int32
			cfg := e.config(md, nil)
			cfg.Retry = retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2}
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
			testobs.Of(cfg).OnOutageStarted = func(string, error) { outages.Add(1) }
			oc := newOutcomes(2)
			testobs.Of(cfg).OnOutcome = oc.hook
			stop := run(t, e.db.Pool, cfg)
			select {
			case <-oc.done:
			case <-time.After(20 * time.Second):
				t.Fatalf("after 20s the slow message is not given up: %d handler calls, %d to OnFailure, %d outages reported (its own timeout is waited out as a PostgreSQL outage)",
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

// TestLagWhileStuck: Lag keeps growing while the handler is stuck and the
// prefetch buffer is full, counting every message that arrives behind it
// (LastStable is also read from the log end, not only from fetches that
// fit in the buffer). Otherwise idemkit_consumer_lag would under-report
// exactly when a partition is stuck, and IdemkitConsumerLagHigh would
// never fire for it.
func TestLagWhileStuck(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("first", "k", 1))
	gate := make(chan struct{})
	blocked := make(chan struct{})
	var once sync.Once
	cfg := e.config(modes[0], func(ctx context.Context, m *consumer.Message) error {
		if m.ID == "first" {
			once.Do(func() { close(blocked) })
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	cfg.MaxBufferedBytes = 4 * consumer.MessageOverhead // a few small messages
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	defer func() { close(gate); cancel(); <-errc }()
	wait(t, blocked, "the handler of first")
	var more []kafka.Message
	for i := range 50 {
		more = append(more, msg(fmt.Sprintf("m%d", i), "k", 1))
	}
	e.produce(more...)
	deadline := time.Now().Add(5 * time.Second)
	var ps []consumer.PartitionStatus
	for time.Now().Before(deadline) {
		if ps = r.Partitions(); len(ps) == 1 && ps[0].Lag == 51 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("51 messages wait behind a stuck handler; Partitions reports %+v (Lag frozen at the last fetch that fit in the buffer)", ps)
}

// TestIdleInTransactionTimeoutIsAnAttempt: a handler that waits on
// something slow with the transaction open (an HTTP call) past the server's
// idle_in_transaction_session_timeout (a common production setting) has
// its session terminated by the server (FATAL 25P03). That is the
// message's doing: it goes through the retry policy to OnFailure. The error
// wraps the 25P03 PgError, which retry.IsConnection does not call a
// connection error; were the handler's verdict dropped, it would be neither
// an attempt nor an outage, Run would return it and the runner would stop
// on the same message at every restart.
func TestIdleInTransactionTimeoutIsAnAttempt(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("slow", "k", 1), msg("next", "k", 1))
			var calls atomic.Int32
			cfg := e.config(md, nil)
			cfg.Retry = retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2}
			cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == "slow" {
					calls.Add(1)
					if _, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = '100ms'`); err != nil {
						return err
					}
					time.Sleep(400 * time.Millisecond) // the slow external call
					_, err := tx.Exec(ctx, `SELECT 1`)
					return err
				}
				return e.effect(ctx, tx, m)
			})
			var failed atomic.Int32
			cfg.OnFailure = func(context.Context, *consumer.Message, error) error { failed.Add(1); return nil }
			var outages atomic.Int32
			testobs.Of(cfg).OnOutageStarted = func(string, error) { outages.Add(1) }
			oc := newOutcomes(2)
			testobs.Of(cfg).OnOutcome = oc.hook
			stop := run(t, e.db.Pool, cfg)
			select {
			case <-oc.done:
			case <-time.After(20 * time.Second):
				t.Fatalf("after 20s the slow message is not given up: %d handler calls, %d to OnFailure, %d outages reported; Run: %v",
					calls.Load(), failed.Load(), outages.Load(), stop())
			}
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}
