package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idemkit/dedup"
)

// TestSeekRacesFirstWrite: a seek that creates a partition's row (epoch 1)
// while a writer that read no row (epoch 0) is claiming: the writer's
// position does not overwrite the seek's, whichever runs first.
func TestSeekRacesFirstWrite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, seekFirst := range []bool{true, false} {
		db, s := newStore(t)
		first, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		seek := func() error {
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, _, err := s.SeekTx(ctx, tx, "billing", "orders", map[int]int64{0: 3}, false); err != nil {
				return err
			}
			return tx.Commit(ctx)
		}
		c := dedup.Claim{Consumer: "billing", MessageID: "m9", Topic: "orders", Partition: 0, Offset: 9}
		done := make(chan error, 1)
		if seekFirst {
			if _, _, err := s.SeekTx(ctx, first, "billing", "orders", map[int]int64{0: 3}, false); err != nil {
				t.Fatal(err)
			}
			go func() {
				tx, err := db.Pool.Begin(ctx)
				if err != nil {
					done <- err
					return
				}
				defer func() { _ = tx.Rollback(ctx) }()
				if _, err := s.ClaimWithPositionTx(ctx, tx, c); err != nil {
					done <- err
					return
				}
				done <- tx.Commit(ctx)
			}()
		} else {
			if _, err := s.ClaimWithPositionTx(ctx, first, c); err != nil {
				t.Fatal(err)
			}
			go func() { done <- seek() }()
		}
		time.Sleep(300 * time.Millisecond)
		if err := first.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		ps, err := s.ListPositions(ctx, db.Pool, "billing", "orders")
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 1 || ps[0].Next != 3 {
			t.Fatalf("seek first %v: positions %+v, want the seek's 3", seekFirst, ps)
		}
	}
}
