package consumer

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/testenv"
)

type boundKey struct{}

// TestCommitBound: the context a commit runs with keeps the transaction's
// values, is not cancelled with it, ends at a deadline at most
// commitTimeout away, is made again once it is older than
// commitBoundReuse, and lets context.AfterFunc (which pgx calls for every
// statement) register without a goroutine of its own.
func TestCommitBound(t *testing.T) {
	var b commitBound
	defer b.stop()
	tctx, cancel := context.WithCancel(context.WithValue(context.Background(), boundKey{}, "trace"))
	d := b.detach(tctx)
	cancel()
	if got := d.Value(boundKey{}); got != "trace" {
		t.Fatalf("Value = %v, want the transaction's value", got)
	}
	if err := d.Err(); err != nil {
		t.Fatalf("cancelling the transaction's context reached the commit's: %v", err)
	}
	deadline, ok := d.Deadline()
	if !ok || time.Until(deadline) > commitTimeout || time.Until(deadline) < commitTimeout-commitBoundReuse()-time.Second {
		t.Fatalf("Deadline = %v, %t; want one within commitTimeout (%v)", deadline, ok, commitTimeout)
	}
	if again, _ := b.detach(context.Background()).Deadline(); !again.Equal(deadline) {
		t.Fatalf("a second transaction within commitBoundReuse got a new deadline %v, want %v", again, deadline)
	}
	first := b.ctx
	b.made = b.made.Add(-commitBoundReuse())
	// The transaction's context is cancellable, as the worker's is.
	live, stopLive := context.WithCancel(context.Background())
	defer stopLive()
	renewed := b.detach(live)
	if first.Err() == nil {
		t.Fatal("the bound replaced was not released")
	}
	if later, _ := renewed.Deadline(); !later.After(deadline) {
		t.Fatalf("an old bound was reused: deadline %v, want after %v", later, deadline)
	}

	// AfterFunc on a context whose parent is not one of the context
	// package's starts a goroutine per call; here it must not.
	before := runtime.NumGoroutine()
	var stops []func() bool
	for range 100 {
		stops = append(stops, context.AfterFunc(renewed, func() {}))
	}
	if n := runtime.NumGoroutine() - before; n > 10 {
		t.Fatalf("context.AfterFunc started %d goroutines for 100 calls", n)
	}
	for _, stop := range stops {
		if !stop() {
			t.Fatal("an AfterFunc ran before its context ended")
		}
	}
	ran := make(chan struct{})
	context.AfterFunc(renewed, func() { close(ran) })
	b.stop()
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("ending the bound did not run the AfterFunc registered on the commit's context")
	}
	if renewed.Err() == nil {
		t.Fatal("the commit's context outlived its bound")
	}
}

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
	w := &worker{r: &Runner{cfg: Config{pool: pool}, chains: budgetOf(pool)}}
	defer w.bound.stop()
	slow := func(tx pgx.Tx) error {
		time.Sleep(2 * commitTimeout)
		_, err := tx.Exec(context.Background(), `SELECT 1`)
		return err
	}
	for i := range 2 { // the second with the worker's bound made before
		err := w.runTx(context.Background(), nil, testSteps{func(b *pgx.Batch) error { b.Queue(`SELECT 1`); return nil }, slow})
		if err != nil {
			t.Fatalf("runTx %d with a handler of %v (commitTimeout %v): %v", i, 2*commitTimeout, commitTimeout, err)
		}
	}
	if err := inTx(context.Background(), pool, slow); err != nil {
		t.Fatalf("inTx with a handler of %v (commitTimeout %v): %v", 2*commitTimeout, commitTimeout, err)
	}
}
