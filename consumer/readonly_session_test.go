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

// TestReadOnlySessionIsReplaced: a handler makes its pooled session
// read-only (SET SESSION CHARACTERISTICS outlives its transaction), so the
// next claim on that connection is refused with 25006 although the server
// takes writes. The runner drops that connection and carries on with a new
// one: the next message is applied, Run does not return. A runner that
// kept the connection would wait on the same read-only session for ever.
func TestReadOnlySessionIsReplaced(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("m1", "A", 1))
			cfg := e.config(md, nil)
			cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if m.ID == "m1" {
					if _, err := tx.Exec(ctx, `SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY`); err != nil {
						return err
					}
				}
				return e.effect(ctx, tx, m)
			})
			var outages atomic.Int32
			testobs.Of(cfg).OnOutageStarted = func(string, error) { outages.Add(1) }
			first, second := newOutcomes(1), newOutcomes(2)
			testobs.Of(cfg).OnOutcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
				first.hook(ctx, m, o)
				second.hook(ctx, m, o)
			}
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- r.Run(ctx) }()
			select {
			case <-first.done:
			case err := <-errc:
				t.Fatalf("Run returned %v", err)
			case <-time.After(time.Minute):
				t.Fatal("m1 not handled")
			}
			// m2 comes after m1's commit: its claim meets the read-only session.
			e.produce(msg("m2", "A", 2))
			select {
			case <-second.done:
			case err := <-errc:
				t.Fatalf("Run returned %v", err)
			case <-time.After(30 * time.Second):
				t.Fatalf("m2 not handled in 30s (%d outages reported) while the server took writes", outages.Load())
			}
			cancel()
			if err := <-errc; err != nil {
				t.Fatalf("Run: %v", err)
			}
			if runs := e.runs(); runs["m1"] != 1 || runs["m2"] != 1 {
				t.Fatalf("effects %v, want m1 and m2 once", runs)
			}
		})
	}
}

// TestReadOnlyHandlerInParkedRelease: in NonBlocking mode, a parked message
// whose handler makes its transaction read-only (SET TRANSACTION READ ONLY)
// fails by its own doing: the release's own writes (removing the parked
// row) go before the handler, so no statement of idemkit meets the 25006,
// the failure is charged as an attempt, and the message ends at OnFailure
// after ParkedRetry's attempts. A removal after the handler would get
// 25006, be taken for an outage and run the handler again for ever.
func TestReadOnlyHandlerInParkedRelease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("p1", "A", 1))
	var calls atomic.Int32
	cfg := e.config(baseModes[0], nil)
	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("dependency down") // parks p1
		}
		if _, err := tx.Exec(ctx, `SET TRANSACTION READ ONLY`); err != nil {
			return err
		}
		return e.effect(ctx, tx, m) // 25006: the handler's own doing
	})
	cfg.FailureMode = consumer.NonBlocking
	cfg.Retry = retry.Policy{MaxAttempts: 1}
	cfg.ParkedPoll = 20 * time.Millisecond
	cfg.ParkedRetry = retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 3}
	var outages atomic.Int32
	testobs.Of(cfg).OnOutageStarted = func(string, error) { outages.Add(1) }
	gave := make(chan struct{})
	cfg.OnFailure = func(context.Context, *consumer.Message, error) error {
		close(gave)
		return nil
	}
	stop := run(t, e.db.Pool, cfg)
	select {
	case <-gave:
	case <-time.After(30 * time.Second):
		t.Fatalf("p1 never reached OnFailure: handler ran %d times, %d outages", calls.Load(), outages.Load())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// One failure in place, then ParkedRetry's attempts (the first parked
	// attempt is the second overall): never more.
	if n := calls.Load(); n > 4 {
		t.Errorf("handler ran %d times for one message", n)
	}
	if n := outages.Load(); n != 0 {
		t.Errorf("%d outages reported for a handler's read-only transaction", n)
	}
}
