package pgsession_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/testenv"
)

type onWarn struct {
	slog.Handler
	once *sync.Once
	ch   chan struct{}
}

func (h onWarn) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == pgsession.LockWaitMsg {
		h.once.Do(func() { close(h.ch) })
	}
	return h.Handler.Handle(ctx, r)
}

// TestLockWatch: a statement that waits for the lock of a transaction left
// idle is reported once, naming the blocking session, its state and how
// long it has been idle; the next statement watched, which waits for
// nothing, is not.
func TestLockWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testenv.DatabaseURL(t)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	holder, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close(ctx)
	waiter, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer waiter.Close(ctx)

	key := time.Now().UnixNano()
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
		t.Fatal(err)
	}
	logs, log := testenv.NewLogs(t)
	warned := make(chan struct{})
	log = slog.New(onWarn{Handler: log.Handler(), once: new(sync.Once), ch: warned})

	w := &pgsession.LockWatch{DB: pool, Threshold: 50 * time.Millisecond, Log: log}
	w.Start(ctx, waiter.PgConn().PID())
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Exec(ctx, "SELECT pg_advisory_lock($1), pg_advisory_unlock($1)", key)
		done <- err
	}()
	select {
	case <-warned:
	case err := <-done:
		t.Fatalf("the waiting statement returned while the lock was held: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no warning within a minute")
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ran, blocked := w.Stop()
	if !blocked {
		t.Fatal("stop says the statement was not blocked")
	}
	n := logs.CountFunc(pgsession.LockWaitMsg, func(rec map[string]any) bool {
		return rec["blocking_pid"] == float64(holder.PgConn().PID()) && rec["blocking_state"] == "idle in transaction" &&
			rec["pid"] == float64(waiter.PgConn().PID())
	})
	if n != 1 {
		t.Fatalf("%d warnings naming the idle holder, want 1", n)
	}
	t.Logf("the statement ran %v", ran)

	w.Start(ctx, waiter.PgConn().PID())
	if _, err := waiter.Exec(ctx, "SELECT pg_sleep(0.2)"); err != nil {
		t.Fatal(err)
	}
	if _, blocked := w.Stop(); blocked {
		t.Fatal("a statement that waited for no lock was reported blocked")
	}
	if n := logs.Count(pgsession.LockWaitMsg, ""); n != 1 {
		t.Fatalf("%d warnings, want still 1", n)
	}
}
