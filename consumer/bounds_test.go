package consumer_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// TestTransactionBoundedOnTheServer: every transaction the runner runs a
// handler in ends itself on the server once idle for HandlerTimeout plus
// the margin (idle_in_transaction_session_timeout, SET LOCAL with BEGIN),
// so that a client that vanishes does not leave its claims' locks held for
// hours; the session's own setting is left as it was.
func TestTransactionBoundedOnTheServer(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("m1", "k", 1), msg("m2", "k", 1))
			var mu sync.Mutex
			seen := map[string]bool{}
			cfg := e.config(md, nil)
			cfg.HandlerTimeout = 3 * time.Second
			inner := cfg.Handler
			record := func(ctx context.Context, tx pgx.Tx) error {
				var v string
				if err := tx.QueryRow(ctx, `SHOW idle_in_transaction_session_timeout`).Scan(&v); err != nil {
					return err
				}
				mu.Lock()
				seen[v] = true
				mu.Unlock()
				return nil
			}
			if md.set {
				innerBatch := cfg.BatchHandler
				cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
					if err := record(ctx, tx); err != nil {
						return err
					}
					return innerBatch.HandleBatch(ctx, tx, msgs)
				})
			} else {
				cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if err := record(ctx, tx); err != nil {
						return err
					}
					return inner.Handle(ctx, tx, m)
				})
			}
			oc := newOutcomes(2)
			testobs.Of(cfg).OnOutcome = oc.hook
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "two outcomes")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if want := "13s"; len(seen) != 1 || !seen[want] {
				t.Fatalf("idle_in_transaction_session_timeout in the handler's transactions: %v, want only %s", seen, want)
			}
			var session string
			if err := e.db.Pool.QueryRow(context.Background(), `SHOW idle_in_transaction_session_timeout`).Scan(&session); err != nil {
				t.Fatal(err)
			}
			if session != "0" {
				t.Fatalf("the pool's sessions were left with idle_in_transaction_session_timeout %s, want 0", session)
			}
		})
	}
}

// TestHandlerTimeout: a handler call gets a context that ends after
// HandlerTimeout; a handler that runs out of it fails, and is retried like
// a transient failure, not waited out as an outage.
func TestHandlerTimeout(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("slow", "k", 1))
			first := true
			var deadlineSeen time.Duration
			cfg := e.config(md, func(ctx context.Context, m *consumer.Message) error {
				if !first {
					return nil
				}
				first = false // one partition's worker calls this: no race
				d, ok := ctx.Deadline()
				if !ok {
					return errors.New("the handler's context has no deadline")
				}
				deadlineSeen = time.Until(d)
				<-ctx.Done() // the handler outlives its time
				return ctx.Err()
			})
			cfg.HandlerTimeout = 300 * time.Millisecond
			oc := newOutcomes(1)
			var retried []error
			testobs.Of(cfg).OnOutcome = oc.hook
			testobs.Of(cfg).OnRetry = func(_ context.Context, _ *consumer.Message, _ int, err error, _ retry.Class, _ time.Duration) {
				retried = append(retried, err)
			}
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "the slow message")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if deadlineSeen <= 0 || deadlineSeen > 300*time.Millisecond {
				t.Fatalf("the handler's deadline was %v away, want within HandlerTimeout (300ms)", deadlineSeen)
			}
			if len(retried) != 1 || !errors.Is(retried[0], context.DeadlineExceeded) {
				t.Fatalf("retries %v, want one for the deadline", retried)
			}
			if runs := e.runs(); runs["slow"] != 1 || oc.count(consumer.Applied) != 1 {
				t.Fatalf("effects %v, applied %d; want slow once", runs, oc.count(consumer.Applied))
			}
		})
	}
}

// logSignal is a slog.Handler that closes ch at the first record with message
// msg, and passes every record on.
type logSignal struct {
	slog.Handler
	msg  string
	once *sync.Once
	ch   chan struct{}
	mu   *sync.Mutex
	rec  *slog.Record
}

func newLogSignal(next slog.Handler, msg string) *logSignal {
	return &logSignal{Handler: next, msg: msg, once: &sync.Once{}, ch: make(chan struct{}), mu: &sync.Mutex{}, rec: &slog.Record{}}
}

func (s *logSignal) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == s.msg {
		s.once.Do(func() {
			s.mu.Lock()
			*s.rec = r.Clone()
			s.mu.Unlock()
			close(s.ch)
		})
	}
	return s.Handler.Handle(ctx, r)
}

func (s *logSignal) WithAttrs(as []slog.Attr) slog.Handler {
	c := *s
	c.Handler = s.Handler.WithAttrs(as)
	return &c
}

func (s *logSignal) WithGroup(name string) slog.Handler {
	c := *s
	c.Handler = s.Handler.WithGroup(name)
	return &c
}

// attr returns the value of the signalled record's attribute key.
func (s *logSignal) attr(key string) slog.Value {
	s.mu.Lock()
	defer s.mu.Unlock()
	var v slog.Value
	s.rec.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value
			return false
		}
		return true
	})
	return v
}

// TestClaimBlockedByAnOrphanIsReported: a claim that waits for a lock an
// orphaned transaction holds (here: the same message ID claimed by a
// session left idle in its transaction) is logged at WARN with the blocking
// session, and its transaction's TxEnd says how long it waited; once the
// orphan ends, the message is applied once. Not parallel: it shortens the
// warning's threshold.
func TestClaimBlockedByAnOrphanIsReported(t *testing.T) {
	defer consumer.SetLockWaitWarn(200 * time.Millisecond)()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			e := newEnv(t, 1)
			ctx := context.Background()
			orphan, err := e.db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer orphan.Rollback(context.Background()) //nolint:errcheck // ended by the test
			var pid uint32
			if err := orphan.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				t.Fatal(err)
			}
			cfg := e.config(md, nil)
			if _, err := e.store.ClaimTx(ctx, orphan, dedup.Claim{Consumer: cfg.GroupID, MessageID: "m1", Topic: e.topic}); err != nil {
				t.Fatal(err)
			}
			e.produce(msg("m1", "k", 1))
			sig := newLogSignal(cfg.Logger.Handler(), pgsession.LockWaitMsg)
			cfg.Logger = slog.New(sig)
			oc := newOutcomes(1)
			var waited time.Duration
			testobs.Of(cfg).OnOutcome = oc.hook
			testobs.Of(cfg).OnLockWait = func(d time.Duration) { waited = d }
			stop := run(t, e.db.Pool, cfg)
			wait(t, sig.ch, "the warning of a claim waiting for the orphan")
			if got := sig.attr("blocking_pid").Uint64(); got != uint64(pid) {
				t.Fatalf("blocking_pid %d, want the orphan's %d", got, pid)
			}
			if got := sig.attr("blocking_state").String(); got != "idle in transaction" {
				t.Fatalf("blocking_state %q, want idle in transaction", got)
			}
			if err := orphan.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			wait(t, oc.done, "m1 once the orphan ended")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if waited < 200*time.Millisecond {
				t.Fatalf("TxEnd LockWait %v, want at least the 200ms threshold", waited)
			}
			if runs := e.runs(); runs["m1"] != 1 {
				t.Fatalf("effects %v, want m1 once", runs)
			}
		})
	}
}
