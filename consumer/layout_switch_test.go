package consumer_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
)

// TestSwitchPendingIsWaitedOut: while a switch to the daily layout is
// in progress — here left after EnableDaily's first step, as a crash
// leaves it, and held back by a lock its VALIDATE waits for — a claim of a
// UUIDv7 dated DailyFrom or later is refused with ErrLayoutChanged at every
// try. The runner waits that out instead of giving up on the transaction
// after a number of tries and stopping Run, and its own partition
// maintenance finishes the switch once the lock is gone: the message is
// then applied once.
func TestSwitchPendingIsWaitedOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 1)
	var today time.Time
	if err := e.db.Pool.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today); err != nil {
		t.Fatal(err)
	}
	other, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.EnableDaily(ctx, e.db.Pool, dedup.DailyConfig{}); err != nil {
		t.Fatal(err)
	}
	// Back to the state after EnableDaily's first step.
	layout := pgx.Identifier{e.db.Schema, migrate.DerivedName(migrate.ProcessedMessagesDefault, "_layout")}.Sanitize()
	if _, err := e.db.Pool.Exec(ctx, `UPDATE `+layout+` SET daily_ready = false`); err != nil {
		t.Fatal(err)
	}
	// VALIDATE waits for this lock; claims do not.
	hold, err := e.db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hold.Rollback(ctx) }()
	if _, err := hold.Exec(ctx, `LOCK TABLE `+pgx.Identifier{e.db.Schema, migrate.ProcessedMessagesDefault}.Sanitize()+
		` IN SHARE UPDATE EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	oc := newOutcomes(1)
	refused := make(chan struct{})
	var refusals atomic.Int32
	var once sync.Once
	cfg := e.config(modes[0], nil)
	testobs.Of(cfg).OnOutcome = oc.hook
	testobs.Of(cfg).OnTxEnd = func(_ context.Context, _ []*consumer.Message, _ []consumer.Outcome, err error, _ time.Duration) {
		if errors.Is(err, dedup.ErrLayoutChanged) {
			if refusals.Add(1) == 15 { // more than the ten runs of a conflicting transaction
				once.Do(func() { close(refused) })
			}
		}
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.Run(rctx) }()

	id := testenv.UUID7(t, today.AddDate(0, 0, 2).Add(time.Hour)) // dated DailyFrom
	e.produce(msg(id, "a", 1))
	select {
	case <-refused:
	case err := <-errc:
		t.Fatalf("Run stopped while the switch was pending: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("timed out waiting for claims refused while the switch is pending")
	}
	// The lock goes: the runner's maintenance finishes the switch.
	if err := hold.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		t.Fatalf("Run stopped while the switch was pending: %v", err)
	case <-oc.done:
	case <-time.After(90 * time.Second):
		t.Fatal("timed out waiting for the message")
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := e.runs()[id]; got != 1 {
		t.Fatalf("effect ran %d times, want 1", got)
	}
	fresh, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := fresh.Layout(ctx, e.db.Pool); err != nil || !l.Daily() {
		t.Fatalf("layout after the runner's maintenance: %+v, %v; want daily", l, err)
	}
}
