package dedup_test

// Edges of the daily layout: a claim racing a switch, a day dropped and
// asked for again, a detach interrupted, a switch waiting out long claims.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/dedupq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestQueuedClaimAfterConcurrentForget: the consumer's worker reads
// the layout (Store.Layout, in tx()) and then queues its claims, which
// cannot read it. The store is shared by every partition's worker: when
// another worker's claim meets the flat table's CHECK in between, the store
// forgets the layout. The queued claim must then still be queued (or fail
// with the retryable ErrLayoutChanged), not fail with ErrLayoutUnknown,
// which the runner does not retry (not retryableTx, not a connection
// error) and which would stop Run.
func TestQueuedClaimAfterConcurrentForget(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	tomorrow := testenv.Today(t, db.Pool).AddDate(0, 0, 2) // DailyFrom
	// Both workers' tx() read the (flat) layout.
	if _, err := dedupq.Of(s).Layout(ctx, db.Pool, 0); err != nil {
		t.Fatal(err)
	}
	other, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.EnableDaily(ctx, db.Pool, dedup.DailyConfig{}); err != nil {
		t.Fatal(err)
	}
	// Worker A's claim is refused: the store forgets the layout.
	if _, err := claimOne(t, db, s, dedup.Claim{Consumer: "c", MessageID: testenv.UUID7(t, noon(tomorrow)), Topic: "t"}); !errors.Is(err, dedup.ErrLayoutChanged) {
		t.Fatalf("worker A: %v, want ErrLayoutChanged", err)
	}
	// Worker B, which read the layout before A's claim, queues its claims.
	var b pgx.Batch
	var dup, moved bool
	err = dedupq.Of(s).QueueClaimMove(&b, dedupq.Claim{Consumer: "c", MessageID: testenv.UUID7(t, noon(tomorrow)), Topic: "t", Partition: 1}, &dup, &moved)
	if err != nil {
		t.Errorf("worker B's queued claim: %v; the runner stops on this error (want it queued)", err)
	}
	var dups []bool
	err = dedupq.Of(s).QueueClaimBatch(&b, []dedupq.Claim{{Consumer: "c", MessageID: testenv.UUID7(t, noon(tomorrow)), Topic: "t", Partition: 2},
		{Consumer: "c", MessageID: "order-1", Topic: "t", Partition: 2, Offset: 1}}, &dups)
	if err != nil {
		t.Errorf("worker B's queued batch: %v; the runner stops on this error (want it queued, or ErrLayoutChanged)", err)
	}
}

// TestDroppedDayStaysDropped: a day MaintainPartitions dropped is not
// created again, empty, when a maintainer's window reaches it again (here
// KeepDays raised; the same can happen at midnight when a maintainer that
// read now() before midnight lists the partitions after another dropped
// that day). An ID of that day, claimed before the drop, must not be
// claimed as new (applied twice): the contract says ErrPartitionDropped.
func TestDroppedDayStaysDropped(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	today := testenv.Today(t, db.Pool)
	if _, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{AheadDays: 2}); err != nil {
		t.Fatal(err)
	}
	testenv.BackdateDaily(t, db.Pool, db.Schema, 10)
	if _, err := s.MaintainPartitions(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	s2, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	old := testenv.UUID7(t, noon(today.AddDate(0, 0, -5)))
	if dup, err := claimOne(t, db, s2, dedup.Claim{Consumer: "c", MessageID: old, Topic: "t"}); err != nil || dup {
		t.Fatalf("claim: %v %v", dup, err)
	}
	for _, keep := range []int{3, 10} {
		if _, err := s2.EnableDaily(ctx, db.Pool, dedup.DailyConfig{KeepDays: keep, AheadDays: 2}); err != nil {
			t.Fatal(err)
		}
		if _, err := s2.MaintainPartitions(ctx, db.Pool); err != nil {
			t.Fatal(err)
		}
	}
	dup, err := claimOne(t, db, s2, dedup.Claim{Consumer: "c", MessageID: old, Topic: "t"})
	if err == nil && !dup {
		t.Fatalf("an ID claimed before its day was dropped is claimed again as new once the day is re-created: applied twice")
	}
}

// TestDetachedPartitionIsDropped: dropPartition detaches, then drops in
// a second statement. When the drop does not happen (the runner's context
// ends between the two, or DROP's lock_timeout), the detached table is no
// longer a partition and Partitions does not list it; the next
// MaintainPartitions must still drop it, or it would stay, with its day's
// rows, for good.
func TestDetachedPartitionIsDropped(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	if _, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{AheadDays: 2}); err != nil {
		t.Fatal(err)
	}
	testenv.BackdateDaily(t, db.Pool, db.Schema, 10)
	if _, err := s.MaintainPartitions(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	parts, err := s.Partitions(ctx, db.Pool)
	if err != nil || len(parts) == 0 {
		t.Fatalf("partitions %v %v", parts, err)
	}
	oldest := parts[0]
	daily := db.Table(migrate.DerivedName(migrate.ProcessedMessagesDefault, "_daily"))
	table := pgx.Identifier{db.Schema, oldest.Name}.Sanitize()
	// dropPartition's DETACH … CONCURRENTLY completed, its DROP did not.
	if _, err := db.Pool.Exec(ctx, `ALTER TABLE `+daily+` DETACH PARTITION `+table+` CONCURRENTLY`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{KeepDays: 3, AheadDays: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.MaintainPartitions(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	var exists bool
	if err := db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("%s (day %s, older than the 3 days kept) is still there after MaintainPartitions: leaked",
			oldest.Name, oldest.Day.Format(time.DateOnly))
	}
}

// TestEnableDailyWaitsOutLongClaims: EnableDaily's CHECK needs a lock
// that every claim waits behind while it is requested; it asks for it at
// most 300 ms at a time, so a consumer transaction held longer than that
// does not make the switch fail: it is asked for again until granted, and
// the claims made meanwhile go through.
func TestEnableDailyWaitsOutLongClaims(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := s.ClaimTx(ctx, tx, dedup.Claim{Consumer: "c", MessageID: "order-1", Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	admin, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	enabled := make(chan error, 1)
	go func() { _, err := admin.EnableDaily(ctx, db.Pool, dedup.DailyConfig{}); enabled <- err }()
	// Claims of other IDs, while the first transaction is held for 2 s.
	for i := 0; i < 10; i++ {
		if _, err := claimOne(t, db, s, dedup.Claim{Consumer: "c", MessageID: fmt.Sprintf("order-%d", 100+i), Topic: "t"}); err != nil {
			t.Fatalf("claim while EnableDaily waits: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-enabled:
		if err != nil {
			t.Fatalf("EnableDaily: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("EnableDaily did not finish after the long transaction ended")
	}
	if l, err := admin.Layout(ctx, db.Pool); err != nil || !l.Daily() {
		t.Fatalf("layout %+v, %v; want daily", l, err)
	}
}
