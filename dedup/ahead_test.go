package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestQueueClaimLeavesThePosition: QueueClaim claims without touching the
// position; QueueMovePosition, in a transaction of its own, moves it and
// marks it ClaimsAhead, never back, not a missing row (moved false) and not
// under another epoch; SeekTx clears the mark.
func TestQueueClaimLeavesThePosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	const consumer, topic = "billing", "orders"
	list := func(q dedup.DBTX) []dedup.Position {
		t.Helper()
		p, err := s.ListPositions(ctx, q, consumer, topic)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// claim claims id at offset in a transaction of its own, checking
	// inside it that the position did not move.
	claim := func(id string, offset int64) (dup bool) {
		t.Helper()
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		dup = true
		c := dedup.Claim{Consumer: consumer, MessageID: id, Topic: topic, Partition: 2, Offset: offset}
		if err := s.QueueClaim(b, c, &dup); err != nil {
			t.Fatalf("QueueClaim: %v", err)
		}
		before := list(db.Pool)
		tx := beginWith(t, db.Pool, b)
		if after := list(tx); !slices.Equal(after, before) {
			t.Fatalf("positions in the claim's transaction: %+v, before it %+v: QueueClaim wrote one", after, before)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return dup
	}
	// move moves the position to next (epoch e) in a transaction of its
	// own, sent in one round trip.
	move := func(next, e int64) (moved bool) {
		t.Helper()
		conn, err := db.Pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		b := &pgx.Batch{}
		b.Queue("begin")
		if err := s.QueueMovePosition(b, consumer, topic, 2, next, time.UnixMilli(1_700_000_000_000+next-1), e, &moved); err != nil {
			t.Fatalf("QueueMovePosition: %v", err)
		}
		b.Queue("commit")
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("move: %v", err)
		}
		return moved
	}

	if dup := claim("a", 10); dup {
		t.Fatal("first claim of a: duplicate")
	}
	if moved := move(11, 0); moved {
		t.Fatal("move of a missing row: moved")
	}
	if p := list(db.Pool); len(p) != 0 {
		t.Fatalf("positions after moving a missing row: %+v; want none", p)
	}
	if ok, err := s.Processed(ctx, db.Pool, consumer, "a"); err != nil || !ok {
		t.Fatalf("Processed(a) = %v, %v after the commit", ok, err)
	}
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if err := s.SavePositionTx(ctx, tx, consumer, topic, 2, 11, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
	})
	if p := list(db.Pool); len(p) != 1 || p[0].Next != 11 || p[0].ClaimsAhead {
		t.Fatalf("after SavePositionTx: %+v; want next 11, not ClaimsAhead", p)
	}
	if claim("b", 11) || claim("c", 12) {
		t.Fatal("b or c: duplicate")
	}
	if moved := move(11, 0); moved {
		t.Fatal("move to 11 from 11: moved")
	}
	if moved := move(13, 0); !moved {
		t.Fatal("move to 13 from 11: not moved")
	}
	p := list(db.Pool)
	if len(p) != 1 || p[0].Next != 13 || !p[0].ClaimsAhead || p[0].AnchorOffset != 12 {
		t.Fatalf("after the move: %+v; want next 13, anchor 12, ClaimsAhead", p)
	}
	if !claim("c", 20) {
		t.Fatal("c again: not a duplicate")
	}
	if moved := move(12, 0); moved {
		t.Fatal("move back to 12: moved")
	}
	if moved := move(14, 7); moved {
		t.Fatal("move under another epoch: moved")
	}
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if _, _, err := s.SeekTx(ctx, tx, consumer, topic, map[int]int64{2: 11}, false); err != nil {
			t.Fatal(err)
		}
	})
	if p := list(db.Pool); len(p) != 1 || p[0].Next != 11 || p[0].ClaimsAhead {
		t.Fatalf("after a seek: %+v; want next 11, not ClaimsAhead", p)
	}

	var moved bool
	for _, bad := range []error{
		s.QueueClaim(&pgx.Batch{}, dedup.Claim{Consumer: consumer, Topic: topic}, new(bool)),
		s.QueueMovePosition(&pgx.Batch{}, "", topic, 2, 1, time.Time{}, 0, &moved),
		s.QueueMovePosition(&pgx.Batch{}, consumer, topic, -1, 1, time.Time{}, 0, &moved),
		s.QueueMovePosition(&pgx.Batch{}, consumer, topic, 2, -1, time.Time{}, 0, &moved),
	} {
		if !errors.Is(bad, dedup.ErrInvalidInput) {
			t.Errorf("bad input: %v; want ErrInvalidInput", bad)
		}
	}
	if err := s.QueueMovePosition(nil, consumer, topic, 2, 1, time.Time{}, 0, &moved); err == nil {
		t.Error("QueueMovePosition on a nil batch: no error")
	}
}

// TestClaimedAt: true only for a committed claim of the ID by the consumer
// at exactly the coordinates asked, for each way an ID is stored (text,
// uuid, a UUIDv7 in the daily table).
func TestClaimedAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	today := testenv.Today(t, db.Pool)
	if _, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{AheadDays: 3}); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct{ name, id, stored string }{
		{"text", "order-17", "flat"},
		{"uuid", "6f1c0b2e-8d4a-4c4e-9f7a-2b6c1d3e4f50", "flat"},
		{"uuid7 daily", testenv.UUID7(t, today.AddDate(0, 0, 2).Add(time.Hour)), "daily"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dedup.Claim{Consumer: "ledger", MessageID: tc.id, Topic: "payments", Partition: 3 + i, Offset: 40}
			at := func(c dedup.Claim) bool {
				t.Helper()
				ok, err := s.ClaimedAt(ctx, db.Pool, c)
				if err != nil {
					t.Fatalf("ClaimedAt(%+v): %v", c, err)
				}
				return ok
			}
			if at(c) {
				t.Fatal("ClaimedAt before the claim: true")
			}
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.ClaimTx(ctx, tx, c); err != nil {
				t.Fatal(err)
			}
			if at(c) {
				t.Fatal("ClaimedAt of an uncommitted claim, from another connection: true")
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if where := whereStored(t, db, c.Consumer, tc.id); where != tc.stored {
				t.Fatalf("claim stored %q, want %q", where, tc.stored)
			}
			if !at(c) {
				t.Fatal("ClaimedAt of the committed claim, no position: false")
			}
			inTx(t, db.Pool, func(tx pgx.Tx) { // the position, written before the claim
				if _, err := tx.Exec(ctx, `INSERT INTO `+db.Table(migrate.ConsumerPositionsDefault)+`
					(consumer, topic, kafka_partition, next_offset, updated_at, claims_ahead)
					VALUES ($1, $2, $3, 40, '2000-01-01 00:00:00+00', true)`, c.Consumer, c.Topic, c.Partition); err != nil {
					t.Fatal(err)
				}
			})
			if !at(c) {
				t.Fatal("ClaimedAt of the committed claim, made since the position's last write: false")
			}
			// A write of the position after the claim: the claim is behind
			// it (what a seek rewound over).
			inTx(t, db.Pool, func(tx pgx.Tx) {
				if _, _, err := s.SeekTx(ctx, tx, c.Consumer, c.Topic, map[int]int64{c.Partition: 40}, false); err != nil {
					t.Fatal(err)
				}
			})
			if at(c) {
				t.Fatal("ClaimedAt of a claim made before the position's last write: true")
			}
			inTx(t, db.Pool, func(tx pgx.Tx) { // as if the seek came before the claim
				if _, err := tx.Exec(ctx, `UPDATE `+db.Table(migrate.ConsumerPositionsDefault)+`
					SET updated_at = '2000-01-01 00:00:00+00' WHERE kafka_partition = $1`, c.Partition); err != nil {
					t.Fatal(err)
				}
			})
			if !at(c) {
				t.Fatal("ClaimedAt of the committed claim, the position written before it again: false")
			}
			for name, other := range map[string]func(*dedup.Claim){
				"offset":    func(c *dedup.Claim) { c.Offset++ },
				"partition": func(c *dedup.Claim) { c.Partition += 10 },
				"topic":     func(c *dedup.Claim) { c.Topic = "refunds" },
				"consumer":  func(c *dedup.Claim) { c.Consumer = "audit" },
			} {
				o := c
				other(&o)
				if at(o) {
					t.Errorf("ClaimedAt with another %s: true", name)
				}
			}
		})
	}
	if _, err := s.ClaimedAt(ctx, db.Pool, dedup.Claim{Consumer: "ledger", MessageID: "", Topic: "payments"}); !errors.Is(err, dedup.ErrInvalidInput) {
		t.Fatalf("ClaimedAt with an empty ID: %v; want ErrInvalidInput", err)
	}
}

// TestPurgeKeepsClaimsAhead: Purge and PurgeConsumer keep, however old, the
// claims past a position that says ClaimsAhead (a consumer starting there
// needs them to pass what it committed); everything else old goes.
func TestPurgeKeepsClaimsAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	processed := db.Table(migrate.ProcessedMessagesDefault)
	positions := db.Table(migrate.ConsumerPositionsDefault)
	// claimAll claims n messages of consumer's partition, two hours ago, and
	// sets its position to next, marked ahead, written before the claims
	// (as a run of chained claims leaves it) or after them (a seek).
	claimAll := func(consumer string, partition int, n int, next int64, ahead, writtenBefore bool) {
		t.Helper()
		batch := make([]dedup.Claim, n)
		for i := range batch {
			batch[i] = dedup.Claim{Consumer: consumer, MessageID: fmt.Sprintf("%s-%d-%d", consumer, partition, i),
				Topic: "orders", Partition: partition, Offset: int64(i)}
		}
		inTx(t, db.Pool, func(tx pgx.Tx) {
			if _, err := s.ClaimBatchTx(ctx, tx, batch); err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `UPDATE `+processed+` SET processed_at = now() - interval '2 hours'
				WHERE consumer = $1 AND kafka_partition = $2`, consumer, partition); err != nil {
				t.Fatal(err)
			}
			written := "now() - interval '1 hour'"
			if writtenBefore {
				written = "now() - interval '3 hours'"
			}
			if _, err := tx.Exec(ctx, `UPDATE `+positions+` SET next_offset = $3, claims_ahead = $4, updated_at = `+written+`
				WHERE consumer = $1 AND kafka_partition = $2`, consumer, partition, next, ahead); err != nil {
				t.Fatal(err)
			}
		})
	}
	left := func(consumer string, partition int) int {
		t.Helper()
		return count(t, db.Pool, `SELECT count(*) FROM `+processed+` WHERE consumer = $1 AND kafka_partition = $2`, consumer, partition)
	}
	claimAll("billing", 0, 10, 6, true, true)  // offsets 6..9 lie past the position
	claimAll("billing", 1, 10, 6, false, true) // no mark: all old
	claimAll("billing", 2, 10, 6, true, false) // claims older than the position's last write (a seek)
	claimAll("audit", 0, 10, 3, true, true)

	n, err := s.PurgeConsumer(ctx, db.Pool, "billing", time.Hour, 3)
	if err != nil || n != 26 {
		t.Fatalf("PurgeConsumer(billing) = %d, %v; want 26, nil", n, err)
	}
	if l0, l1, l2, la := left("billing", 0), left("billing", 1), left("billing", 2), left("audit", 0); l0 != 4 || l1 != 0 || l2 != 0 || la != 10 {
		t.Fatalf("left after PurgeConsumer: billing/0 %d, billing/1 %d, billing/2 %d, audit/0 %d; want 4, 0, 0, 10", l0, l1, l2, la)
	}
	if n, err := s.Purge(ctx, db.Pool, time.Hour, 0); err != nil || n != 3 {
		t.Fatalf("Purge = %d, %v; want 3, nil (audit's offsets 0..2)", n, err)
	}
	if l0, la := left("billing", 0), left("audit", 0); l0 != 4 || la != 7 {
		t.Fatalf("left after Purge: billing/0 %d, audit/0 %d; want 4, 7", l0, la)
	}
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if _, _, err := s.SeekTx(ctx, tx, "billing", "orders", map[int]int64{0: 6}, false); err != nil {
			t.Fatal(err)
		}
	})
	if n, err := s.Purge(ctx, db.Pool, time.Hour, 0); err != nil || n != 4 {
		t.Fatalf("Purge after a seek cleared the mark = %d, %v; want 4, nil", n, err)
	}
}
