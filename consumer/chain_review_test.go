package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

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

// TestChainHandlerEndedTx: a handler that ends its transaction itself
// (the `defer tx.Rollback(ctx)` idiom copied from ordinary pgx code) and
// returns nil has nothing committed: its effect and claim are gone. Its
// message must not be reported applied nor its offset move (the COMMIT a
// chain sends on a connection outside a transaction is answered COMMIT,
// with a warning): the runner stops on pgx.ErrTxClosed as it does when
// that commit is sent alone.
func TestChainHandlerEndedTx(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const n = 40
	e.backlog(n)
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, 4)
	cfg := e.config(modes[0], nil)
	var applied atomic.Int32
	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		defer func() { _ = tx.Rollback(ctx) }()
		if m.ID == "m-0" {
			time.Sleep(500 * time.Millisecond) // let the backlog be fetched
		}
		return e.effect(ctx, tx, m)
	})
	cfg.Hooks.Outcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
		if o == consumer.Applied {
			applied.Add(1)
		}
	}
	r, err := consumer.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = r.Run(ctx)
	if !errors.Is(err, pgx.ErrTxClosed) {
		t.Errorf("Run: %v, want pgx.ErrTxClosed", err)
	}
	if got := applied.Load(); got != 0 || len(e.runs()) != 0 {
		t.Fatalf("%d messages reported applied, %d effects committed: want none", got, len(e.runs()))
	}
	pos, err := e.store.Positions(context.Background(), e.db.Pool, e.group, e.topic)
	if err != nil {
		t.Fatal(err)
	}
	if pos[0] != 0 {
		t.Fatalf("position moved to %d with nothing committed", pos[0])
	}
}

// TestChainSessionTerminated: the session of a transaction begun with the
// commit before is terminated (pg_terminate_backend) while it waits for
// its handler: its message runs again on a new connection, uncharged, and
// every message is applied once.
func TestChainSessionTerminated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const n = 60
	e.backlog(n)
	tr := &chainTracer{}
	pool, app := tracedPool(t, tr, 4)
	oc := newOutcomes(n)
	cfg := e.config(modes[0], nil)
	cfg.Retry = &retry.Policy{MaxAttempts: 1}
	var terminated, failed atomic.Int32
	cfg.OnFailure = func(_ context.Context, m *consumer.Message, err error) error {
		t.Errorf("%s handed to OnFailure: %v", m.ID, err)
		failed.Add(1)
		oc.hook(context.Background(), m, consumer.Failed)
		return nil
	}
	cfg.Hooks.Outcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
		if m.ID == "m-10" || m.ID == "m-30" {
			var k int32
			if err := e.db.Pool.QueryRow(context.WithoutCancel(ctx), `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
				FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, app).Scan(&k); err != nil {
				t.Error(err)
			}
			terminated.Add(k)
		}
		oc.hook(ctx, m, o)
	}
	stop := run(t, pool, cfg)
	wait(t, oc.done, "all messages")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("%d chained sessions terminated", terminated.Load())
	if terminated.Load() == 0 {
		t.Fatal("no chained transaction was open while the hook ran")
	}
	if failed.Load() != 0 {
		t.Fatalf("%d messages failed", failed.Load())
	}
	e.checkOnce(n)
}

// TestChainSessionMadeReadOnly: a handler makes its session read-only
// (SET SESSION CHARACTERISTICS, committed with its transaction): the
// transaction begun with its COMMIT is read-only and its claims fail with
// 25006. The message before is committed and reported once; the
// connection is dropped (dropReadOnly) and the next message runs as usual
// on a new one; every message is applied once and nothing fails.
func TestChainSessionMadeReadOnly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const n = 60
	e.backlog(n)
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, 4)
	oc := newOutcomes(n)
	cfg := e.config(modes[0], nil)
	cfg.Retry = &retry.Policy{MaxAttempts: 1}
	var failed atomic.Int32
	cfg.OnFailure = func(_ context.Context, m *consumer.Message, err error) error {
		t.Errorf("%s handed to OnFailure: %v", m.ID, err)
		failed.Add(1)
		oc.hook(context.Background(), m, consumer.Failed)
		return nil
	}
	cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "m-10" || m.ID == "m-30" {
			if _, err := tx.Exec(ctx, `SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY`); err != nil {
				return err
			}
		}
		return e.effect(ctx, tx, m)
	})
	cfg.Hooks.Outcome = oc.hook
	stop := run(t, pool, cfg)
	wait(t, oc.done, "all messages")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	chained, errs := tr.counts()
	t.Logf("%d chained, failed: %v", chained, errs)
	if len(errs) == 0 {
		t.Fatal("no chained batch met the read-only session")
	}
	if failed.Load() != 0 || oc.count(consumer.Applied) != n {
		t.Fatalf("%d failed, %d applied", failed.Load(), oc.count(consumer.Applied))
	}
	e.checkOnce(n)
}

// TestChainTightPoolSharedByRunners: two runners of three partitions each,
// MaxPartitions 2, on one pool of two connections, whose TxStart and
// Outcome hooks use that pool: chains never take the connection a hook
// waits for, every message is applied once, and nothing stays acquired.
func TestChainTightPoolSharedByRunners(t *testing.T) {
	t.Parallel()
	const n = 150
	tr := &chainTracer{}
	pool, app := tracedPool(t, tr, 2)
	var envs []*env
	var stops []func() error
	var ocs []*outcomes
	for range 2 {
		e := newEnv(t, 3)
		e.backlog(n)
		oc := newOutcomes(n)
		cfg := e.config(modes[0], nil)
		cfg.MaxPartitions = 2
		use := func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
				t.Errorf("hook: %v", err)
			}
		}
		cfg.Hooks.TxStart = func(ctx context.Context, _ []*consumer.Message, _ int) context.Context {
			use(ctx)
			return ctx
		}
		cfg.Hooks.Outcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
			use(ctx)
			oc.hook(ctx, m, o)
		}
		envs, ocs = append(envs, e), append(ocs, oc)
		stops = append(stops, run(t, pool, cfg))
	}
	for i, oc := range ocs {
		wait(t, oc.done, fmt.Sprintf("runner %d's messages", i))
	}
	for _, stop := range stops {
		if err := stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
	for _, e := range envs {
		e.checkOnce(n)
	}
	chained, errs := tr.counts()
	t.Logf("%d chained, %d failed", chained, len(errs))
	if chained == 0 {
		t.Fatal("nothing chained")
	}
	if got := pool.Stat().AcquiredConns(); got != 0 {
		t.Fatalf("%d connections still acquired", got)
	}
	assertNoOpenTx(t, envs[0], app)
}

// TestChainOrderWithFailures: one partition, every 7th message's handler
// fails once (in a transaction begun with the commit before, with
// BatchSize 1): the messages are applied once each, in offset order, in
// every mode.
func TestChainOrderWithFailures(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			const n = 140
			msgs := make([]kafka.Message, n)
			for i := range msgs {
				msgs[i] = msg(fmt.Sprintf("m-%03d", i), "k", 1)
			}
			e.produce(msgs...)
			tr := &chainTracer{}
			pool, _ := tracedPool(t, tr, 4)
			var failedOnce sync.Map
			cfg := e.config(md, func(_ context.Context, m *consumer.Message) error {
				var i int
				if _, err := fmt.Sscanf(m.ID, "m-%d", &i); err == nil && i%7 == 3 {
					if _, done := failedOnce.LoadOrStore(m.ID, true); !done {
						return errors.New("first attempt fails")
					}
				}
				return nil
			})
			e.runAll(pool, cfg, n)
			order := e.appliedOrder()
			if !slices.IsSorted(order) {
				t.Fatalf("applied out of offset order: %v", order)
			}
			chained, errs := tr.counts()
			t.Logf("%d chained, %d failed", chained, len(errs))
		})
	}
}

// TestChainRebalance: a second runner joins the group while the first
// chains transactions on four partitions: the generation ends with chains
// open (rolled back, their connections given back), the partitions move,
// and every message is applied once.
func TestChainRebalance(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4)
	const n = 600
	e.backlog(n)
	tr := &chainTracer{}
	pool, app := tracedPool(t, tr, 6)
	oc := newOutcomes(n)
	var joined atomic.Bool
	var generations atomic.Int32
	second := make(chan struct{})
	newCfg := func() *consumer.Config {
		cfg := e.config(modes[0], nil)
		cfg.Hooks.Rebalanced = func(int32, []int) { generations.Add(1) }
		cfg.Hooks.Outcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
			time.Sleep(20 * time.Millisecond)
			oc.hook(ctx, m, o)
			if oc.count(consumer.Applied) == n/6 && joined.CompareAndSwap(false, true) {
				close(second)
			}
		}
		return cfg
	}
	stop1 := run(t, pool, newCfg())
	select {
	case <-second:
	case <-time.After(60 * time.Second):
		t.Fatal("the first runner applied too little")
	}
	stop2 := run(t, pool, newCfg())
	wait(t, oc.done, "all messages")
	if generations.Load() < 3 { // the first runner's, then both runners'
		t.Fatalf("%d assignments: the second runner joined after the backlog was done", generations.Load())
	}
	if err := stop1(); err != nil {
		t.Fatalf("Run 1: %v", err)
	}
	if err := stop2(); err != nil {
		t.Fatalf("Run 2: %v", err)
	}
	e.checkOnce(n)
	if got := pool.Stat().AcquiredConns(); got != 0 {
		t.Fatalf("%d connections still acquired", got)
	}
	assertNoOpenTx(t, e, app)
	chained, errs := tr.counts()
	t.Logf("%d chained, %d failed; applied %d, duplicates %d", chained, len(errs), oc.count(consumer.Applied), oc.count(consumer.Duplicate))
}
