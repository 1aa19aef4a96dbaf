package dedup_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/migrate"
)

func listPositions(t *testing.T, s *dedup.Store, q dedup.DBTX, consumer, topic string) []dedup.Position {
	t.Helper()
	p, err := s.ListPositions(context.Background(), q, consumer, topic)
	if err != nil {
		t.Fatalf("ListPositions(%s, %s): %v", consumer, topic, err)
	}
	return p
}

// brief is a Position without its timestamps, for comparisons.
type brief struct {
	partition         int
	next, incarnation int64
	anchored          bool
}

func briefs(ps []dedup.Position) []brief {
	out := make([]brief, len(ps))
	for i, p := range ps {
		out[i] = brief{p.Partition, p.Next, p.Incarnation, !p.AnchorTime.IsZero()}
	}
	return out
}

func wantBriefs(t *testing.T, what string, got []dedup.Position, want ...brief) {
	t.Helper()
	b := briefs(got)
	if len(b) != len(want) {
		t.Fatalf("%s = %+v, want %+v", what, b, want)
	}
	for i := range b {
		if b[i] != want[i] {
			t.Fatalf("%s = %+v, want %+v", what, b, want)
		}
	}
}

func TestSeekMovesBackAndForth(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	table := db.Table(migrate.ConsumerPositionsDefault)
	inTx(t, db.Pool, func(tx pgx.Tx) {
		for p, next := range map[int]int64{0: 50, 1: 70} {
			if err := s.SavePositionTx(ctx, tx, "billing", "orders", p, next, time.Time{}, 0); err != nil {
				t.Fatal(err)
			}
		}
		// Another consumer and another topic are left alone.
		if err := s.SavePositionTx(ctx, tx, "shipping", "orders", 0, 90, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.SavePositionTx(ctx, tx, "billing", "refunds", 0, 90, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
	})
	// The consumer anchored partition 0.
	if _, err := db.Pool.Exec(ctx, `UPDATE `+table+` SET anchor_time = now()
		WHERE consumer = 'billing' AND topic = 'orders' AND kafka_partition = 0`); err != nil {
		t.Fatal(err)
	}
	wantBriefs(t, "positions", listPositions(t, s, db.Pool, "billing", "orders"),
		brief{0, 50, 0, true}, brief{1, 70, 0, false})

	start := time.Now()
	var before, after []dedup.Position
	inTx(t, db.Pool, func(tx pgx.Tx) {
		var err error
		before, after, err = s.SeekTx(ctx, tx, "billing", "orders", map[int]int64{0: 10, 2: 5}, false)
		if err != nil {
			t.Fatal(err)
		}
	})
	wantBriefs(t, "before", before, brief{0, 50, 0, true}) // partition 2 had none
	wantBriefs(t, "after", after, brief{0, 10, 0, false}, brief{2, 5, 0, false})
	if after[0].UpdatedAt.Before(start.Add(-time.Minute)) {
		t.Fatalf("updated_at not set: %v", after[0].UpdatedAt)
	}
	wantBriefs(t, "positions", listPositions(t, s, db.Pool, "billing", "orders"),
		brief{0, 10, 0, false}, brief{1, 70, 0, false}, brief{2, 5, 0, false})
	wantBriefs(t, "other consumer", listPositions(t, s, db.Pool, "shipping", "orders"), brief{0, 90, 0, false})
	wantBriefs(t, "other topic", listPositions(t, s, db.Pool, "billing", "refunds"), brief{0, 90, 0, false})

	// The consumer's writes still only move positions on.
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if err := s.SavePositionTx(ctx, tx, "billing", "orders", 0, 8, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
	})
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{0: 10, 1: 70, 2: 5})

	// Forwards works too; a rolled back seek changes nothing.
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.SeekTx(ctx, tx, "billing", "orders", map[int]int64{1: 1000}, false); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), map[int]int64{0: 10, 1: 70, 2: 5})
}

func TestSeekNewIncarnation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	table := db.Table(migrate.ConsumerPositionsDefault)
	inTx(t, db.Pool, func(tx pgx.Tx) {
		for p, next := range map[int]int64{0: 50, 1: 70, 2: 30} {
			if err := s.SavePositionTx(ctx, tx, "billing", "orders", p, next, time.Time{}, 0); err != nil {
				t.Fatal(err)
			}
		}
	})
	if _, err := db.Pool.Exec(ctx, `UPDATE `+table+` SET incarnation = 2 WHERE kafka_partition = 1`); err != nil {
		t.Fatal(err)
	}

	// Without newIncarnation a recorded incarnation stays, a new position
	// gets the topic's highest.
	inTx(t, db.Pool, func(tx pgx.Tx) {
		_, after, err := s.SeekTx(ctx, tx, "billing", "orders", map[int]int64{0: 1, 3: 0}, false)
		if err != nil {
			t.Fatal(err)
		}
		wantBriefs(t, "after", after, brief{0, 1, 0, false}, brief{3, 0, 2, false})
	})
	// With it, every position written gets the highest plus one; those not
	// written keep theirs.
	inTx(t, db.Pool, func(tx pgx.Tx) {
		_, after, err := s.SeekTx(ctx, tx, "billing", "orders", map[int]int64{0: 0, 1: 0}, true)
		if err != nil {
			t.Fatal(err)
		}
		wantBriefs(t, "after", after, brief{0, 0, 3, false}, brief{1, 0, 3, false})
	})
	wantBriefs(t, "positions", listPositions(t, s, db.Pool, "billing", "orders"),
		brief{0, 0, 3, false}, brief{1, 0, 3, false}, brief{2, 30, 0, false}, brief{3, 0, 2, false})
}

func TestSeekInvalidInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	for _, tc := range []struct {
		name, consumer, topic string
		to                    map[int]int64
	}{
		{"bad consumer", "", "orders", map[int]int64{0: 1}},
		{"bad topic", "billing", "", map[int]int64{0: 1}},
		{"nothing", "billing", "orders", nil},
		{"negative partition", "billing", "orders", map[int]int64{-1: 1}},
		{"negative offset", "billing", "orders", map[int]int64{0: -1}},
	} {
		inTx(t, db.Pool, func(tx pgx.Tx) {
			if _, _, err := s.SeekTx(ctx, tx, tc.consumer, tc.topic, tc.to, false); !errors.Is(err, dedup.ErrInvalidInput) {
				t.Errorf("%s: err = %v, want ErrInvalidInput", tc.name, err)
			}
		})
	}
	if _, err := s.ListPositions(ctx, db.Pool, "billing", ""); !errors.Is(err, dedup.ErrInvalidInput) {
		t.Errorf("ListPositions with no topic: err = %v, want ErrInvalidInput", err)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM `+db.Table(migrate.ConsumerPositionsDefault)); n != 0 {
		t.Fatalf("%d positions written", n)
	}
}
