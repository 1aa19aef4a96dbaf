package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
)

// chainTracer watches the batches that commit one transaction and begin
// the next on the same connection (their first query is the COMMIT).
type chainTracer struct {
	mu      sync.Mutex
	chained int
	errs    []error // of the chained batches that failed
}

type chainKey struct{}

func (c *chainTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (c *chainTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData)     {}
func (c *chainTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *chainTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if q := data.Batch.QueuedQueries; len(q) > 1 && q[0].SQL == "commit" && q[1].SQL == "begin" {
		return context.WithValue(ctx, chainKey{}, true)
	}
	return ctx
}

func (c *chainTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	if ctx.Value(chainKey{}) == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.chained++
	if data.Err != nil {
		c.errs = append(c.errs, data.Err)
	}
}

func (c *chainTracer) counts() (int, []error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chained, append([]error(nil), c.errs...)
}

// tracedPool is a pool on the test server, with the tracer, at most
// maxConns connections, its own application_name and params (name, value
// pairs of run-time parameters).
func tracedPool(t *testing.T, tr *chainTracer, maxConns int32, params ...string) (*pgxpool.Pool, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	app := testenv.Name(t, "app")
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	for i := 0; i+1 < len(params); i += 2 {
		cfg.ConnConfig.RuntimeParams[params[i]] = params[i+1]
	}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, app
}

// backlog produces n messages "m-0".."m-<n-1>" over keys k0..k9.
func (e *env) backlog(n int) {
	e.t.Helper()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = msg(fmt.Sprintf("m-%d", i), fmt.Sprintf("k%d", i%10), 1)
	}
	e.produce(msgs...)
}

// waitApplied waits, at most 90 s, until n messages have had an effect.
func (e *env) waitApplied(n int) {
	e.t.Helper()
	deadline := time.After(90 * time.Second)
	for len(e.runs()) < n {
		select {
		case <-deadline:
			e.t.Fatalf("%d of %d messages applied", len(e.runs()), n)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// checkOnce fails unless each of the n backlog messages had its effect
// exactly once.
func (e *env) checkOnce(n int) {
	e.t.Helper()
	runs := e.runs()
	if len(runs) != n {
		e.t.Fatalf("%d messages had an effect, want %d", len(runs), n)
	}
	for id, r := range runs {
		if r != 1 {
			e.t.Fatalf("%s ran %d times", id, r)
		}
	}
}

// runAll runs a runner with cfg on pool until the n backlog messages are
// reported (after cfg.Hooks.Outcome, when set), stops it and checks each
// was applied once. It returns the runner, stopped.
func (e *env) runAll(pool *pgxpool.Pool, cfg *consumer.Config, n int) *consumer.Runner {
	e.t.Helper()
	oc := newOutcomes(n)
	if cfg.Hooks.Outcome == nil {
		cfg.Hooks.Outcome = oc.hook
	} else {
		own := cfg.Hooks.Outcome
		cfg.Hooks.Outcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
			own(ctx, m, o)
			oc.hook(ctx, m, o)
		}
	}
	r, err := consumer.New(pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	stop := runRunner(e.t, r)
	wait(e.t, oc.done, "all messages")
	if err := stop(); err != nil {
		e.t.Fatalf("Run: %v", err)
	}
	e.checkOnce(n)
	return r
}

// TestChainedTransactions: with a backlog, a partition's transactions
// follow one another on one connection (the COMMIT of one travels with the
// BEGIN and claims of the next), every message still applied once, and
// nothing is left holding a connection when Run returns.
func TestChainedTransactions(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			const n = 300
			e.backlog(n)
			tr := &chainTracer{}
			pool, app := tracedPool(t, tr, 4)
			e.runAll(pool, e.config(md, nil), n)
			chained, errs := tr.counts()
			t.Logf("%s: %d transactions began with the commit before", md.name, chained)
			if md.batch == 1 && chained == 0 {
				t.Fatal("no transaction began with the commit of the one before")
			}
			if len(errs) > 0 {
				t.Fatalf("chained batches failed: %v", errs)
			}
			if got := pool.Stat().AcquiredConns(); got != 0 {
				t.Fatalf("%d connections still acquired after Run returned", got)
			}
			assertNoOpenTx(t, e, app)
			var next int64
			if err := e.db.Pool.QueryRow(context.Background(), `SELECT next_offset FROM `+e.db.Table("consumer_positions")).Scan(&next); err != nil {
				t.Fatal(err)
			}
			if next != n {
				t.Fatalf("position %d, want %d", next, n)
			}
		})
	}
}

// assertNoOpenTx fails when a session of app is inside a transaction.
func assertNoOpenTx(t *testing.T, e *env, app string) {
	t.Helper()
	var open int
	if err := e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, app).Scan(&open); err != nil {
		t.Fatal(err)
	}
	if open != 0 {
		t.Fatalf("%d sessions left in a transaction", open)
	}
}

// TestChainedCommitFails: a COMMIT that fails (a deferred constraint
// trigger raises, the first time only) while the next transaction was
// queued behind it: the failed message is not taken for committed, the
// next one's transaction never ran, and both are applied once.
func TestChainedCommitFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	// m-40 to m-49 each fail their first commit: sequences are not
	// transactional, so the count survives the rollback.
	for i := 40; i < 50; i++ {
		if _, err := e.db.Pool.Exec(ctx, `CREATE SEQUENCE `+e.db.Table(fmt.Sprintf("first_m_%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	fn := e.db.Table("fail_first_commit")
	if _, err := e.db.Pool.Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.id BETWEEN 'm-40' AND 'm-49' AND length(NEW.id) = 4
				AND nextval(quote_ident('`+e.db.Schema+`') || '.' || quote_ident('first_' || replace(NEW.id, '-', '_'))) = 1 THEN
				RAISE EXCEPTION 'deferred check failed at commit of %', NEW.id;
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER fail_first_commit AFTER INSERT ON `+e.effects+`
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+fn+`()`); err != nil {
		t.Fatal(err)
	}
	const n = 120
	e.backlog(n)
	tr := &chainTracer{}
	pool, app := tracedPool(t, tr, 4)
	stops := e.runUntilApplied(t, pool, n, nil, func(err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && strings.Contains(pgErr.Message, "deferred check failed at commit")
	})
	e.checkOnce(n)
	_, errs := tr.counts()
	t.Logf("%d runs stopped on a failed commit, %d of those commits chained", stops, len(errs))
	if stops != 10 || len(errs) == 0 || len(errs) > 10 {
		t.Fatalf("%d runs stopped, %d chained commits failed; want 10, and 1 to 10", stops, len(errs))
	}
	for _, err := range errs {
		if !strings.Contains(err.Error(), "deferred check failed at commit") {
			t.Fatalf("chained batch failed with %v", err)
		}
	}
	assertNoOpenTx(t, e, app)
}

// TestChainedCommitRolledBack: a handler that swallowed a statement's
// error returns nil on an aborted transaction, whose COMMIT PostgreSQL
// answers with ROLLBACK. Queued with the next transaction's BEGIN, that
// answer is still seen: the message is not taken for committed (its effect
// and claim were rolled back) and runs again; the next one is applied once.
func TestChainedCommitRolledBack(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const n = 120
	e.backlog(n)
	tr := &chainTracer{}
	pool, app := tracedPool(t, tr, 4)
	var swallowed sync.Map // m-40 to m-49, each the first time
	handler := consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID >= "m-40" && m.ID <= "m-49" && len(m.ID) == 4 {
			if _, done := swallowed.LoadOrStore(m.ID, true); !done {
				_, _ = tx.Exec(ctx, "SELECT 1/0") // the error is dropped: the transaction is aborted
				return nil
			}
		}
		return e.effect(ctx, tx, m)
	})
	stops := e.runUntilApplied(t, pool, n, handler, func(err error) bool { return errors.Is(err, pgx.ErrTxCommitRollback) })
	e.checkOnce(n)
	_, errs := tr.counts()
	t.Logf("%d runs stopped on a commit answered with ROLLBACK, %d of those commits chained", stops, len(errs))
	if stops != 10 || len(errs) == 0 || len(errs) > 10 {
		t.Fatalf("%d runs stopped, %d chained commits failed; want 10, and 1 to 10", stops, len(errs))
	}
	for _, err := range errs {
		if !errors.Is(err, pgx.ErrTxCommitRollback) {
			t.Fatalf("chained batch failed with %v, want ErrTxCommitRollback", err)
		}
	}
	assertNoOpenTx(t, e, app)
}

// runUntilApplied runs the consumer (BatchSize 1; handler, or the env's
// effect when nil) on pool again each time Run stops with an error that
// stopped accepts, until the n backlog messages are applied, and returns
// how many runs stopped. It fails on any other outcome of Run, and when an
// Outcome hook reports a message Applied whose effect is not committed.
func (e *env) runUntilApplied(t *testing.T, pool *pgxpool.Pool, n int, handler consumer.Handler, stopped func(error) bool) int {
	t.Helper()
	stops := 0
	deadline := time.Now().Add(3 * time.Minute)
	for len(e.runs()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages applied, %d runs stopped", len(e.runs()), n, stops)
		}
		cfg := e.config(modes[0], nil)
		if handler != nil {
			cfg.Handler = handler
		}
		cfg.Hooks.AfterCommit = func(ctx context.Context, msgs []*consumer.Message) {
			for _, m := range msgs {
				var runs int
				if err := e.db.Pool.QueryRow(context.WithoutCancel(ctx), `SELECT runs FROM `+e.effects+` WHERE id = $1`, m.ID).Scan(&runs); err != nil || runs != 1 {
					t.Errorf("%s reported committed: runs %d, %v", m.ID, runs, err)
				}
			}
		}
		r, err := consumer.New(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- r.Run(ctx) }()
		for len(e.runs()) < n {
			select {
			case err := <-errc:
				if !stopped(err) {
					cancel()
					t.Fatalf("Run: %v", err)
				}
				stops++
				errc = nil
			case <-time.After(20 * time.Millisecond):
				if time.Now().Before(deadline) {
					continue
				}
			}
			break
		}
		cancel()
		if errc != nil {
			if err := <-errc; err != nil && !stopped(err) {
				t.Fatalf("Run: %v", err)
			}
		}
	}
	return stops
}

// TestChainStoppedMidway: Run stopped while a transaction begun by the
// commit before is open rolls it back and gives its connection back; a
// new runner applies the rest, each message once.
func TestChainStoppedMidway(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const n = 400
	e.backlog(n)
	tr := &chainTracer{}
	pool, app := tracedPool(t, tr, 4)
	// The Outcome hook of a committed transaction runs while the next one,
	// begun with its commit, is open: stopping the runner there leaves it
	// to the worker's way out.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen atomic.Int32
	cfg := e.config(modes[0], nil)
	cfg.Hooks.Outcome = func(context.Context, *consumer.Message, consumer.Outcome) {
		if seen.Add(1) == n/4 {
			cancel()
		}
	}
	r, err := consumer.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v", err)
	}
	if got := pool.Stat().AcquiredConns(); got != 0 {
		t.Fatalf("%d connections still acquired after Run returned", got)
	}
	assertNoOpenTx(t, e, app)
	if chained, _ := tr.counts(); chained == 0 {
		t.Fatal("no transaction began with the commit of the one before")
	}
	// The worker moved the position past its last commit on its way out,
	// although that one claimed its message without moving it.
	if next, _ := e.position(e.group); next != int64(len(e.runs())) {
		t.Fatalf("position after Run: %d; %d messages applied", next, len(e.runs()))
	}

	cfg = e.config(modes[0], nil)
	stop := run(t, pool, cfg)
	e.waitApplied(n)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkOnce(n)
}

// TestChainLeavesAConnection: chained transactions never hold every
// connection of the pool. Here hooks of two partitions' workers use the
// consumer's own pool of two connections after each commit: had both
// workers kept their connection for the next transaction, each would wait
// for the other's for ever.
func TestChainLeavesAConnection(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	const n = 200
	e.backlog(n)
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, 2)
	oc := newOutcomes(n)
	cfg := e.config(modes[0], nil)
	cfg.Hooks.Outcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
			t.Errorf("hook: %v", err)
		}
		oc.hook(ctx, m, o)
	}
	stop := run(t, pool, cfg)
	wait(t, oc.done, "all messages")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkOnce(n)
	if chained, _ := tr.counts(); chained == 0 {
		t.Fatal("no transaction began with the commit of the one before")
	}
}

// TestChainStopWhileClaimWaits: the runner is stopped while the claim of
// a transaction begun with the commit before waits for a lock (another
// session holds an uncommitted claim of the same ID). PostgreSQL answers
// that COMMIT only with the claims after it, so Run returns once the lock
// is released: the message before is committed and reported, the waiting
// one rolled back and applied once by the next run.
func TestChainStopWhileClaimWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const n = 100
	e.backlog(n)
	ctx := context.Background()
	blocker, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = blocker.Rollback(ctx) }()
	if _, err := blocker.Exec(ctx, `INSERT INTO `+e.db.Table("processed_messages")+`
		(consumer, message_id, topic, kafka_partition, kafka_offset) VALUES ($1, 'm-50', $2, 0, 50)`, e.group, e.topic); err != nil {
		t.Fatal(err)
	}
	tr := &chainTracer{}
	pool, app := tracedPool(t, tr, 4)
	oc := newOutcomes(n)
	cfg := e.config(modes[0], nil)
	cfg.Hooks.Outcome = oc.hook
	stop := run(t, pool, cfg)
	deadline := time.After(90 * time.Second)
	var waiting int
	for waiting == 0 { // the claim of m-50 waits for the blocker's lock
		if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		select {
		case <-deadline:
			t.Fatal("no claim waits for the lock")
		case <-time.After(20 * time.Millisecond):
		}
	}
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	time.Sleep(200 * time.Millisecond)
	if err := blocker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-deadline:
		t.Fatal("Run did not return")
	}
	if chained, _ := tr.counts(); chained == 0 {
		t.Fatal("no transaction began with the commit of the one before")
	}
	if got := pool.Stat().AcquiredConns(); got != 0 {
		t.Fatalf("%d connections still acquired after Run returned", got)
	}
	assertNoOpenTx(t, e, app)
	runs := e.runs()
	if len(runs) != 50 || runs["m-49"] != 1 || runs["m-50"] != 0 {
		t.Fatalf("%d messages applied before the stop (m-49 %d times, m-50 %d), want m-0 to m-49 once",
			len(runs), runs["m-49"], runs["m-50"])
	}
	if got := oc.count(consumer.Applied); got != 50 {
		t.Fatalf("%d messages reported applied, want 50", got)
	}
	stop = run(t, pool, e.config(modes[0], nil))
	e.waitApplied(n)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkOnce(n)
}

// TestChainWithEveryPartitionSlotTaken: partitions that hold every slot
// of MaxPartitions still chain while no other partition waits for one.
func TestChainWithEveryPartitionSlotTaken(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2)
	const n = 300
	e.backlog(n)
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, 4)
	cfg := e.config(modes[0], nil)
	cfg.MaxPartitions = 2
	e.runAll(pool, cfg, n)
	if chained, _ := tr.counts(); chained < n/4 {
		t.Fatalf("%d of %d transactions began with the commit before, want most", chained, n)
	}
}

// TestChainPausesForSlowHooks: a chained transaction waits, open with its
// locks, while the hooks of the one before run; when that takes long,
// chaining pauses.
func TestChainPausesForSlowHooks(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const n = 40
	e.backlog(n)
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, 4)
	oc := newOutcomes(n)
	cfg := e.config(modes[0], nil)
	cfg.Hooks.Outcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
		time.Sleep(50 * time.Millisecond) // a slow exporter
		oc.hook(ctx, m, o)
	}
	stop := run(t, pool, cfg)
	wait(t, oc.done, "all messages")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkOnce(n)
	// 40 messages × 50 ms: about 2 s, a chain at most every second.
	if chained, _ := tr.counts(); chained > 6 {
		t.Fatalf("%d transactions began with the commit before while hooks took 50 ms each, want chaining paused", chained)
	}
}

// TestHandlerRollbackStatement: a handler that ends its transaction with a
// ROLLBACK statement and returns nil has nothing committed. A COMMIT sent
// after it, outside any transaction, is answered COMMIT (with a warning),
// which was taken for a commit: the message was reported applied and its
// offset moved. Now Run stops on pgx.ErrTxClosed, as for tx.Rollback.
func TestHandlerRollbackStatement(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("m-0", "k0", 1)) // alone: committed without a chain
			cfg := e.config(md, nil)
			cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if err := e.effect(ctx, tx, m); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "ROLLBACK")
				return err
			})
			var applied atomic.Int32
			cfg.Hooks.Outcome = func(_ context.Context, _ *consumer.Message, o consumer.Outcome) {
				if o == consumer.Applied {
					applied.Add(1)
				}
			}
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := r.Run(ctx); !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatalf("Run: %v, want pgx.ErrTxClosed", err)
			}
			if got := applied.Load(); got != 0 || len(e.runs()) != 0 {
				t.Fatalf("%d messages reported applied, %d effects committed: want none", got, len(e.runs()))
			}
		})
	}
}

// TestChainOnAPoolOfOnePerPartition: with a connection per partition (the
// pool's MaxConns equal to the partitions) and hooks that need none, the
// chain budget (MaxConns-1 transactions left open while their workers are
// away) seldom turns a chain away: it counts a transaction from the end of
// the round trip that begins it, not from before it. Counted from before
// it, the other partition's round trip in flight used the budget up: 245
// of 600 transactions were turned away here (355 chained).
func TestChainOnAPoolOfOnePerPartition(t *testing.T) {
	t.Parallel()
	const partitions, perPartition = 2, 300
	e := newEnv(t, partitions)
	const n = partitions * perPartition
	e.backlog(n)
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, partitions)
	r := e.runAll(pool, e.config(modes[0], nil), n)
	chained, errs := tr.counts()
	if len(errs) > 0 {
		t.Fatalf("chained batches failed: %v", errs)
	}
	away := consumer.ChainsTurnedAway(r)
	t.Logf("%d of %d transactions began with the commit before, %d turned away by the budget", chained, n, away)
	if chained == 0 {
		t.Fatal("no transaction began with the commit of the one before")
	}
	// A chain is turned away only when the other worker is away from its
	// open transaction (reporting the one before) as this one's round trip
	// ends: seldom, even on a loaded machine.
	if away > n/10 {
		t.Fatalf("%d of %d transactions turned away by the chain budget, want at most %d", away, n, n/10)
	}
	if held := consumer.ChainBudgetHeld(pool); held != 0 {
		t.Fatalf("chain budget holds %d after Run returned, want 0", held)
	}
}

// TestChainOnAPoolOfOne: a pool of one connection has no room for a
// transaction left open between two (the chain budget is MaxConns-1), and
// none is begun only to be rolled back: each transaction begins on its own,
// its claims sent once.
func TestChainOnAPoolOfOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	const n = 50
	e.backlog(n)
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, 1)
	r := e.runAll(pool, e.config(modes[0], nil), n)
	if chained, _ := tr.counts(); chained != 0 {
		t.Fatalf("%d transactions began with the commit before on a pool of one, want none", chained)
	}
	if away := consumer.ChainsTurnedAway(r); away == 0 {
		t.Fatal("no chain turned away by the budget of a pool of one: the backlog did not chain at all")
	}
}
