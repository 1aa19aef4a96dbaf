package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/testenv"
)

// TestRunTxReleasesConnection: every way a worker's transaction can end
// gives its connection back to the pool.
func TestRunTxReleasesConnection(t *testing.T) {
	t.Parallel()
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w := &worker{r: &Runner{cfg: Config{pool: pool}, setLocal: pgsession.SetLocal(0)}}
	ok := func(tx pgx.Tx) error { return nil }
	boom := errors.New("boom")
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name  string
		ctx   func() (context.Context, context.CancelFunc)
		first func(b *pgx.Batch) error
		f     func(tx pgx.Tx) error
	}{
		{"first fails", nil, func(b *pgx.Batch) error { return boom }, ok},
		{"acquire fails", func() (context.Context, context.CancelFunc) { return cancelled, func() {} }, func(b *pgx.Batch) error { b.Queue(`SELECT 1`); return nil }, ok},
		{"claim fails", nil, func(b *pgx.Batch) error { b.Queue(`SELECT 1/0`); return nil }, ok},
		{"callback fails", nil, func(b *pgx.Batch) error {
			b.Queue(`SELECT 1`).QueryRow(func(pgx.Row) error { return boom })
			return nil
		}, ok},
		{"f fails", nil, func(b *pgx.Batch) error { b.Queue(`SELECT 1`); return nil }, func(pgx.Tx) error { return boom }},
		{"commit fails", nil, func(b *pgx.Batch) error { b.Queue(`SELECT 1`); return nil }, func(tx pgx.Tx) error {
			if _, err := tx.Exec(context.Background(), `CREATE TEMP TABLE d (x int UNIQUE DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP`); err != nil {
				return err
			}
			_, err := tx.Exec(context.Background(), `INSERT INTO d VALUES (1), (1)`)
			return err
		}},
		{"ctx ends during the claim", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, func(b *pgx.Batch) error { b.Queue(`SELECT pg_sleep(2)`); return nil }, ok},
		{"ctx ends during f", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, func(b *pgx.Batch) error { b.Queue(`SELECT 1`); return nil }, func(tx pgx.Tx) error {
			_, err := tx.Exec(context.Background(), `SELECT 1`)
			time.Sleep(200 * time.Millisecond)
			return err
		}},
	}
	for _, c := range cases {
		if c.first == nil {
			continue
		}
		ctx, cancel := context.Background(), func() {}
		if c.ctx != nil {
			ctx, cancel = c.ctx()
		}
		err := w.runTx(ctx, testSteps{c.first, c.f})
		cancel()
		// A closed connection is destroyed asynchronously by the pool.
		for deadline := time.Now().Add(2 * time.Second); pool.Stat().AcquiredConns() != 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		if n := pool.Stat().AcquiredConns(); n != 0 {
			t.Errorf("%s (err %v): %d connections still acquired", c.name, err, n)
		} else {
			t.Logf("%s: err %v; released", c.name, err)
		}
	}
}

// testSteps are the steps of a transaction runTx runs in a test.
type testSteps struct {
	first func(b *pgx.Batch) error
	f     func(tx pgx.Tx) error
}

func (s testSteps) claims(b *pgx.Batch) error               { return s.first(b) }
func (s testSteps) body(_ context.Context, tx pgx.Tx) error { return s.f(tx) }

// TestCommitAfterLongHandler: a handler that runs longer than commitTimeout
// does not leave its commit an expired context (which pgx would not even
// send, and which the runner would take for a lost connection: the
// transaction would run again, and again). Not parallel: it shortens
// commitTimeout.
func TestCommitAfterLongHandler(t *testing.T) {
	saved := commitTimeout
	commitTimeout = 300 * time.Millisecond
	defer func() { commitTimeout = saved }()
	pool, err := pgxpool.New(context.Background(), testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w := &worker{r: &Runner{cfg: Config{pool: pool}, setLocal: pgsession.SetLocal(0)}}
	slow := func(tx pgx.Tx) error {
		time.Sleep(2 * commitTimeout)
		_, err := tx.Exec(context.Background(), `SELECT 1`)
		return err
	}
	err = w.runTx(context.Background(), testSteps{func(b *pgx.Batch) error { b.Queue(`SELECT 1`); return nil }, slow})
	if err != nil {
		t.Fatalf("runTx with a handler of %v (commitTimeout %v): %v", 2*commitTimeout, commitTimeout, err)
	}
	if err := inTx(context.Background(), pool, 0, func(_ context.Context, tx pgx.Tx) error { return slow(tx) }); err != nil {
		t.Fatalf("inTx with a handler of %v (commitTimeout %v): %v", 2*commitTimeout, commitTimeout, err)
	}
}
