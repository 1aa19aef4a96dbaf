package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/retry"
)

// TestChainIdleTimeoutNotCharged: a transaction begun with the commit
// before stays open, idle, while the hooks of the one before run (and the
// TxStart hook of its own). A server with
// idle_in_transaction_session_timeout ends that session when a hook is
// slow: that is nobody's failure, least of all the next message's, which
// must not spend an attempt on it (here: go to OnFailure unapplied).
func TestChainIdleTimeoutNotCharged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const n = 40
	e.backlog(n)
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, 4, "idle_in_transaction_session_timeout", "300ms")
	oc := newOutcomes(n)
	cfg := e.config(modes[0], nil)
	cfg.Retry = &retry.Policy{MaxAttempts: 1}
	var failed, retries atomic.Int32
	cfg.OnFailure = func(_ context.Context, m *consumer.Message, err error) error {
		t.Errorf("%s handed to OnFailure: %v", m.ID, err)
		failed.Add(1)
		oc.hook(context.Background(), m, consumer.Failed)
		return nil
	}
	cfg.Hooks.Retry = func(_ context.Context, m *consumer.Message, _ int, err error, _ retry.Class, _ time.Duration) {
		retries.Add(1)
	}
	cfg.Hooks.Outcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
		if m.ID == "m-10" || m.ID == "m-20" {
			time.Sleep(time.Second) // a slow metrics push
		}
		oc.hook(ctx, m, o)
	}
	stop := run(t, pool, cfg)
	wait(t, oc.done, "all messages")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if chained, _ := tr.counts(); chained == 0 {
		t.Fatal("no transaction began with the commit of the one before")
	}
	if failed.Load() != 0 || retries.Load() != 0 {
		t.Fatalf("%d messages failed, %d retried, for a session the server ended while a hook ran", failed.Load(), retries.Load())
	}
	e.checkOnce(n)
}
