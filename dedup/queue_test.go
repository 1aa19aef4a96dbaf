package dedup_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/dedupq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// beginWith sends b, which begins a transaction, and returns the
// transaction once b's results are read.
func beginWith(t *testing.T, pool *pgxpool.Pool, b *pgx.Batch) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	br := pool.SendBatch(ctx, b)
	tx := br.Tx()
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if err := br.Close(); err != nil {
		t.Fatalf("send batch: %v", err)
	}
	return tx
}

// TestQueueClaimBatch: a batch of claims queued after BEGIN claims in the
// transaction it begins and moves each partition's position.
func TestQueueClaimBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	inTx(t, db.Pool, func(tx pgx.Tx) {
		claim(t, s, tx, dedup.Claim{Consumer: "billing", MessageID: "a", Topic: "orders", Partition: 0, Offset: 1})
	})
	for _, tc := range []struct {
		name   string
		claims []dedup.Claim
		want   []bool
		pos    map[int]int64
	}{
		{"one partition", []dedup.Claim{
			{Consumer: "billing", MessageID: "z", Topic: "orders", Partition: 0, Offset: 7},
			{Consumer: "billing", MessageID: "a", Topic: "orders", Partition: 0, Offset: 8},
			{Consumer: "billing", MessageID: "z", Topic: "orders", Partition: 0, Offset: 9},
		}, []bool{false, true, true}, map[int]int64{0: 10}},
		{"two partitions", []dedup.Claim{
			{Consumer: "billing", MessageID: "p", Topic: "orders", Partition: 0, Offset: 11},
			{Consumer: "billing", MessageID: "q", Topic: "orders", Partition: 2, Offset: 3},
		}, []bool{false, false}, map[int]int64{0: 12, 2: 4}},
	} {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		var dup []bool
		if err := dedupq.Of(s).QueueClaimBatch(b, qclaims(tc.claims...), &dup); err != nil {
			t.Fatalf("%s: QueueClaimBatch: %v", tc.name, err)
		}
		tx := beginWith(t, db.Pool, b)
		if !slices.Equal(dup, tc.want) {
			t.Fatalf("%s: duplicate = %v, want %v", tc.name, dup, tc.want)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		wantPositions(t, positions(t, s, db.Pool, "billing", "orders"), tc.pos)
	}

	// An empty batch queues nothing and answers at once.
	b := &pgx.Batch{}
	dup := []bool{true}
	if err := dedupq.Of(s).QueueClaimBatch(b, nil, &dup); err != nil || len(dup) != 0 || b.Len() != 0 {
		t.Fatalf("empty: err %v, duplicate %v, %d queued; want nil, [], 0", err, dup, b.Len())
	}
}

// TestQueueInvalidInput: bad input is refused before anything is queued, so
// a batch with a BEGIN in it is still only a BEGIN.
func TestQueueInvalidInput(t *testing.T) {
	t.Parallel()
	_, s := newStore(t)
	good := dedup.Claim{Consumer: "billing", MessageID: "m", Topic: "orders"}
	for name, c := range map[string]dedup.Claim{
		"empty ID":       {Consumer: "billing", Topic: "orders"},
		"NUL in ID":      {Consumer: "billing", MessageID: "a\x00b", Topic: "orders"},
		"empty consumer": {MessageID: "m", Topic: "orders"},
		"bad topic":      {Consumer: "billing", MessageID: "m", Topic: "\xff"},
		"bad offset":     {Consumer: "billing", MessageID: "m", Topic: "orders", Offset: -1},
	} {
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		var dup, moved bool
		if err := dedupq.Of(s).QueueClaimMove(b, dedupq.Claim(c), &dup, &moved); !errors.Is(err, dedup.ErrInvalidInput) {
			t.Errorf("%s: QueueClaimMove = %v, want ErrInvalidInput", name, err)
		}
		var dups []bool
		// The bad claim comes second, after a claim of the same consumer and
		// topic: it is checked all the same.
		if err := dedupq.Of(s).QueueClaimBatch(b, qclaims(good, c), &dups); !errors.Is(err, dedup.ErrInvalidInput) {
			t.Errorf("%s: QueueClaimBatch = %v, want ErrInvalidInput", name, err)
		}
		if b.Len() != 1 {
			t.Errorf("%s: %d statements queued, want only the BEGIN", name, b.Len())
		}
	}
	if err := dedupq.Of(s).QueueClaimMove(nil, dedupq.Claim(good), new(bool), new(bool)); err == nil {
		t.Error("nil batch accepted")
	}
	b := &pgx.Batch{}
	var dup, moved bool
	if err := dedupq.Of(s).QueueClaimMove(b, dedupq.Claim{Consumer: "billing", Topic: "orders"}, &dup, &moved); !errors.Is(err, dedup.ErrInvalidInput) || b.Len() != 0 {
		t.Errorf("QueueClaimMove of an empty ID = %v with %d queued, want ErrInvalidInput and none", err, b.Len())
	}
	if err := dedupq.Of(s).QueueClaimMove(b, dedupq.Claim(good), &dup, nil); err == nil || b.Len() != 0 {
		t.Errorf("QueueClaimMove with a nil result = %v with %d queued, want an error and none", err, b.Len())
	}
}

// TestPositionWritePaths: the position row is inserted by a partition's
// first write and moved by an update after that; both keep the anchor
// rules and the epoch fence.
func TestPositionWritePaths(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	save := func(next int64, at time.Time, epoch int64) {
		t.Helper()
		inTx(t, db.Pool, func(tx pgx.Tx) {
			if err := s.SavePositionTx(ctx, tx, "billing", "orders", 4, next, at, epoch); err != nil {
				t.Fatalf("SavePositionTx: %v", err)
			}
		})
	}
	get := func() dedup.Position {
		t.Helper()
		ps, err := s.ListPositions(ctx, db.Pool, "billing", "orders")
		if err != nil || len(ps) != 1 {
			t.Fatalf("ListPositions = %v, %v; want one", ps, err)
		}
		return ps[0]
	}
	save(10, t0, 0) // inserted
	if p := get(); p.Next != 10 || p.AnchorOffset != 9 || !p.AnchorTime.Equal(t0) {
		t.Fatalf("after insert: %+v", p)
	}
	save(12, time.Time{}, 0) // moved over markers: the anchor stays
	if p := get(); p.Next != 12 || p.AnchorOffset != 9 || !p.AnchorTime.Equal(t0) {
		t.Fatalf("after a move without time: %+v", p)
	}
	save(20, t0.Add(time.Second), 0) // updated with a new anchor
	if p := get(); p.Next != 20 || p.AnchorOffset != 19 || !p.AnchorTime.Equal(t0.Add(time.Second)) {
		t.Fatalf("after update: %+v", p)
	}
	save(15, t0.Add(time.Hour), 0) // lower: left as it is
	if p := get(); p.Next != 20 || p.AnchorOffset != 19 {
		t.Fatalf("after a lower write: %+v", p)
	}
	// Another epoch (a seek since the writer read it) is fenced off, also
	// through a claim.
	save(30, t0, 7)
	inTx(t, db.Pool, func(tx pgx.Tx) {
		claimWithPosition(t, s, tx, dedup.Claim{Consumer: "billing", MessageID: "x", Topic: "orders", Partition: 4, Offset: 40, Epoch: 7})
	})
	if p := get(); p.Next != 20 || p.Epoch != 0 {
		t.Fatalf("after writes of another epoch: %+v", p)
	}
	// One row per partition, whichever path wrote it.
	if n := count(t, db.Pool, "SELECT count(*) FROM "+db.Table(migrate.ConsumerPositionsDefault)); n != 1 {
		t.Fatalf("%d position rows, want 1", n)
	}
}

// TestNotMigrated: every store method on a schema without idemkit's tables
// says so with ErrNotMigrated (not a raw SQLSTATE); bad input does not.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t) // a schema with nothing migrated
	s, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	c := dedup.Claim{Consumer: "billing", MessageID: "m", Topic: "orders"}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dedup.ErrNotMigrated) {
			t.Errorf("%s: %v, want ErrNotMigrated", what, err)
		}
	}
	tx := func(f func(tx pgx.Tx) error) error {
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		return f(tx)
	}
	check("ClaimTx", tx(func(tx pgx.Tx) error { _, err := s.ClaimTx(ctx, tx, c); return err }))
	check("ClaimWithPositionTx", tx(func(tx pgx.Tx) error { _, err := s.ClaimWithPositionTx(ctx, tx, c); return err }))
	check("ClaimBatchTx", tx(func(tx pgx.Tx) error { _, err := s.ClaimBatchTx(ctx, tx, []dedup.Claim{c}); return err }))
	check("SavePositionTx", tx(func(tx pgx.Tx) error { return s.SavePositionTx(ctx, tx, "billing", "orders", 0, 1, time.Time{}, 0) }))
	_, err = s.Positions(ctx, db.Pool, "billing", "orders")
	check("Positions", err)
	_, err = s.ListPositions(ctx, db.Pool, "billing", "orders")
	check("ListPositions", err)
	_, err = s.Processed(ctx, db.Pool, "billing", "m")
	check("Processed", err)
	_, err = s.Purge(ctx, db.Pool, time.Hour, 100)
	check("Purge", err)
	// Bad input is bad input, whatever the schema.
	if err := tx(func(tx pgx.Tx) error { _, err := s.ClaimTx(ctx, tx, dedup.Claim{}); return err }); errors.Is(err, dedup.ErrNotMigrated) || !errors.Is(err, dedup.ErrInvalidInput) {
		t.Errorf("empty claim: %v, want ErrInvalidInput only", err)
	}
}

// queueMove begins a transaction with c claimed and its position moved by
// QueueClaimMove and, when the UPDATE did not move it, finishes with
// SavePositionTx, as the consumer does.
func queueMove(t *testing.T, s *dedup.Store, pool *pgxpool.Pool, c dedup.Claim) (tx pgx.Tx, duplicate, moved bool) {
	t.Helper()
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	duplicate, moved = true, true // must be overwritten
	if err := dedupq.Of(s).QueueClaimMove(b, dedupq.Claim(c), &duplicate, &moved); err != nil {
		t.Fatalf("QueueClaimMove: %v", err)
	}
	if b.Len() != 3 {
		t.Fatalf("%d statements queued, want BEGIN, the claim and the UPDATE", b.Len())
	}
	tx = beginWith(t, pool, b)
	if !moved {
		if err := s.SavePositionTx(context.Background(), tx, c.Consumer, c.Topic, c.Partition, c.Offset+1, c.Time, c.Epoch); err != nil {
			t.Fatalf("SavePositionTx: %v", err)
		}
	}
	return tx, duplicate, moved
}

// TestQueueClaimMove: the claim and the UPDATE of the position row
// travel with BEGIN; the UPDATE moves an existing row on with
// ClaimWithPositionTx's rules (never back, the anchor with a known time, the
// same epoch only) and reports whether it did; a missing row is left to
// SavePositionTx. A rollback undoes both statements.
func TestQueueClaimMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	get := func() dedup.Position {
		t.Helper()
		ps, err := s.ListPositions(ctx, db.Pool, "billing", "orders")
		if err != nil || len(ps) != 1 {
			t.Fatalf("ListPositions = %v, %v; want one", ps, err)
		}
		return ps[0]
	}
	commit := func(tx pgx.Tx) {
		t.Helper()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	uuid := "0190a4b6-3c5d-4e8f-9a0b-1c2d3e4f5a6b"
	for i, tc := range []struct {
		what          string
		c             dedup.Claim
		dup, moved    bool
		next, anchor  int64
		anchorTime    time.Time
		rollback      bool
		epochAfter    int64
		wantProcessed bool
	}{
		{what: "first write: no row to move", c: dedup.Claim{MessageID: "a", Offset: 9, Time: t0},
			moved: false, next: 10, anchor: 9, anchorTime: t0},
		{what: "a UUID, rolled back", c: dedup.Claim{MessageID: uuid, Offset: 10, Time: t0.Add(time.Second)},
			moved: true, next: 10, anchor: 9, anchorTime: t0, rollback: true},
		{what: "a UUID", c: dedup.Claim{MessageID: uuid, Offset: 10, Time: t0.Add(time.Second)},
			moved: true, next: 11, anchor: 10, anchorTime: t0.Add(time.Second)},
		{what: "a duplicate still moves the position", c: dedup.Claim{MessageID: "a", Offset: 11, Time: t0.Add(2 * time.Second)},
			dup: true, moved: true, next: 12, anchor: 11, anchorTime: t0.Add(2 * time.Second)},
		{what: "no time: the anchor stays", c: dedup.Claim{MessageID: "b", Offset: 14},
			moved: true, next: 15, anchor: 11, anchorTime: t0.Add(2 * time.Second)},
		{what: "lower: left as it is", c: dedup.Claim{MessageID: "c", Offset: 3, Time: t0.Add(time.Hour)},
			moved: false, next: 15, anchor: 11, anchorTime: t0.Add(2 * time.Second)},
		{what: "another epoch: left as it is", c: dedup.Claim{MessageID: "d", Offset: 30, Time: t0.Add(time.Hour), Epoch: 7},
			moved: false, next: 15, anchor: 11, anchorTime: t0.Add(2 * time.Second)},
	} {
		c := tc.c
		c.Consumer, c.Topic, c.Partition = "billing", "orders", 4
		tx, dup, moved := queueMove(t, s, db.Pool, c)
		if dup != tc.dup || moved != tc.moved {
			t.Fatalf("%d %s: duplicate %v, moved %v; want %v, %v", i, tc.what, dup, moved, tc.dup, tc.moved)
		}
		if tc.rollback {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		} else {
			commit(tx)
		}
		p := get()
		if p.Next != tc.next || p.AnchorOffset != tc.anchor || !p.AnchorTime.Equal(tc.anchorTime) || p.Epoch != 0 {
			t.Fatalf("%d %s: position %+v; want next %d, anchor %d at %v, epoch 0", i, tc.what, p, tc.next, tc.anchor, tc.anchorTime)
		}
		ok, err := s.Processed(ctx, db.Pool, "billing", c.MessageID)
		if err != nil || ok == tc.rollback {
			t.Fatalf("%d %s: Processed = %v, %v; want %v", i, tc.what, ok, err, !tc.rollback)
		}
	}
	if n := count(t, db.Pool, "SELECT count(*) FROM "+db.Table(migrate.ConsumerPositionsDefault)); n != 1 {
		t.Fatalf("%d position rows, want 1", n)
	}
}

// TestQueueClaimMoveRaces: two owners of a partition during a
// rebalance. Their first writes (no row yet) both end in SavePositionTx,
// whose ON CONFLICT rechecks the row the other committed: the higher
// position wins whichever commits first. Later, an UPDATE that waited on
// the other owner's uncommitted move rechecks the committed row: a lower
// position does not overwrite a higher one.
func TestQueueClaimMoveRaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	claim := func(id string, offset int64) dedup.Claim {
		return dedup.Claim{Consumer: "billing", MessageID: id, Topic: "orders", Partition: 0, Offset: offset}
	}
	race := func(first, second dedup.Claim, want int64) {
		t.Helper()
		a, _, _ := queueMove(t, s, db.Pool, first)
		done := make(chan error, 1)
		go func() {
			// queueMove may not run outside the test's goroutine (t.Fatal).
			b := &pgx.Batch{}
			b.BeginTx(pgx.TxOptions{})
			var dup, moved bool
			if err := dedupq.Of(s).QueueClaimMove(b, dedupq.Claim(second), &dup, &moved); err != nil {
				done <- err
				return
			}
			br := db.Pool.SendBatch(ctx, b)
			tx := br.Tx()
			defer func() { _ = tx.Rollback(ctx) }()
			if err := br.Close(); err != nil {
				done <- err
				return
			}
			if !moved {
				if err := s.SavePositionTx(ctx, tx, second.Consumer, second.Topic, second.Partition, second.Offset+1, second.Time, second.Epoch); err != nil {
					done <- err
					return
				}
			}
			done <- tx.Commit(ctx)
		}()
		time.Sleep(500 * time.Millisecond) // the second waits on the first's row
		if err := a.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got := positions(t, s, db.Pool, "billing", "orders"); got[0] != want {
			t.Fatalf("position %d after both committed (%s at %d, then %s at %d); want %d",
				got[0], first.MessageID, first.Offset, second.MessageID, second.Offset, want)
		}
	}
	race(claim("m4", 4), claim("m9", 9), 10)     // two first writers
	race(claim("m20", 20), claim("m15", 15), 21) // the row exists: never back
	race(claim("m24", 24), claim("m30", 30), 31) // and on
}

// qclaims converts claims for the consumer's protocol.
func qclaims(claims ...dedup.Claim) []dedupq.Claim {
	out := make([]dedupq.Claim, len(claims))
	for i, c := range claims {
		out[i] = dedupq.Claim(c)
	}
	return out
}
