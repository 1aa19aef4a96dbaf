package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idemkit/dedup"
)

// TestFirstPositionWritesRace: two owners of a partition during a
// rebalance both write its first position. A inserts the row (next 5) and
// has not committed; B claims further (next 10): B's UPDATE does not see
// A's row (not in its snapshot), its INSERT … ON CONFLICT DO NOTHING waits
// for A and then does nothing. B commits a claim of offset 9 but the
// position stays 5. The INSERT … ON CONFLICT DO UPDATE … WHERE it replaced
// rechecked the committed row and wrote 10: the new statements are not
// equivalent for a missing row. (Same for SavePositionTx, which is the
// only record of a message handed to OnFailure.)
func TestFirstPositionWritesRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)

	a, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Rollback(ctx) }()
	if _, err := s.ClaimWithPositionTx(ctx, a, dedup.Claim{Consumer: "billing", MessageID: "m4", Topic: "orders", Partition: 0, Offset: 4}); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		b, err := db.Pool.Begin(ctx)
		if err != nil {
			done <- err
			return
		}
		defer func() { _ = b.Rollback(ctx) }()
		if _, err := s.ClaimWithPositionTx(ctx, b, dedup.Claim{Consumer: "billing", MessageID: "m9", Topic: "orders", Partition: 0, Offset: 9}); err != nil {
			done <- err
			return
		}
		done <- b.Commit(ctx)
	}()
	time.Sleep(500 * time.Millisecond) // B waits on A's row
	if err := a.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, err := s.Positions(ctx, db.Pool, "billing", "orders")
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != 10 {
		t.Fatalf("FAILS: position %d after both committed (m9 at offset 9 is claimed); want 10: B's position write was dropped", got[0])
	}
}
