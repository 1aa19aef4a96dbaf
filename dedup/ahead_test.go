package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestQueueClaimLeavesThePosition: QueueClaim claims without touching the
// position; QueueMovePosition, queued before the COMMIT, moves it in the
// same round trip and marks it ClaimsAhead, never back, not a missing row
// (moved false) and not under another epoch; SeekTx clears the mark.
func TestQueueClaimLeavesThePosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, s := newStore(t)
	const consumer, topic = "billing", "orders"
	claim := func(id string, offset int64) dedup.Claim {
		return dedup.Claim{Consumer: consumer, MessageID: id, Topic: topic, Partition: 2, Offset: offset, Time: time.UnixMilli(1_700_000_000_000 + offset)}
	}
	list := func() []dedup.Position {
		t.Helper()
		p, err := s.ListPositions(ctx, db.Pool, consumer, topic)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// claimMove begins a transaction that claims c, then commits it with
	// the move to next (epoch e), both in one round trip each.
	claimMove := func(c dedup.Claim, next, e int64) (dup, moved bool) {
		t.Helper()
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		dup = true
		if err := s.QueueClaim(b, c, &dup); err != nil {
			t.Fatalf("QueueClaim: %v", err)
		}
		tx := beginWith(t, db.Pool, b)
		if p := list(); len(p) != 0 && p[0].Next > c.Offset {
			t.Fatalf("position %d before the move: QueueClaim moved it", p[0].Next)
		}
		b = &pgx.Batch{}
		if err := s.QueueMovePosition(b, consumer, topic, 2, next, time.UnixMilli(1_700_000_000_000+next-1), e, &moved); err != nil {
			t.Fatalf("QueueMovePosition: %v", err)
		}
		b.Queue("commit")
		if err := tx.Conn().SendBatch(ctx, b).Close(); err != nil {
			t.Fatalf("move and commit: %v", err)
		}
		return dup, moved
	}

	if dup, moved := claimMove(claim("a", 10), 11, 0); dup || moved {
		t.Fatalf("first claim: duplicate %v, moved %v; want false, false (no row to move)", dup, moved)
	}
	if ok, err := s.Processed(ctx, db.Pool, consumer, "a"); err != nil || !ok {
		t.Fatalf("Processed(a) = %v, %v after the commit", ok, err)
	}
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if err := s.SavePositionTx(ctx, tx, consumer, topic, 2, 11, time.Time{}, 0); err != nil {
			t.Fatal(err)
		}
	})
	if p := list(); len(p) != 1 || p[0].Next != 11 || p[0].ClaimsAhead {
		t.Fatalf("after SavePositionTx: %+v; want next 11, not ClaimsAhead", p)
	}
	// Claims of b and c leave the position; the move after c marks it.
	if dup, moved := claimMove(claim("b", 11), 11, 0); dup || moved {
		t.Fatalf("b: duplicate %v, moved %v; want false, false (not past 11)", dup, moved)
	}
	if dup, moved := claimMove(claim("c", 12), 13, 0); dup || !moved {
		t.Fatalf("c: duplicate %v, moved %v; want false, true", dup, moved)
	}
	p := list()
	if len(p) != 1 || p[0].Next != 13 || !p[0].ClaimsAhead || p[0].AnchorOffset != 12 {
		t.Fatalf("after the move: %+v; want next 13, anchor 12, ClaimsAhead", p)
	}
	if dup, moved := claimMove(claim("c", 20), 12, 0); !dup || moved {
		t.Fatalf("c again, moved back to 12: duplicate %v, moved %v; want true, false", dup, moved)
	}
	if dup, moved := claimMove(claim("d", 13), 14, 7); dup || moved {
		t.Fatalf("d under another epoch: duplicate %v, moved %v; want false, false", dup, moved)
	}
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if _, _, err := s.SeekTx(ctx, tx, consumer, topic, map[int]int64{2: 11}, false); err != nil {
			t.Fatal(err)
		}
	})
	if p := list(); len(p) != 1 || p[0].Next != 11 || p[0].ClaimsAhead {
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
	for _, tc := range []struct{ name, id, stored string }{
		{"text", "order-17", "flat"},
		{"uuid", "6f1c0b2e-8d4a-4c4e-9f7a-2b6c1d3e4f50", "flat"},
		{"uuid7 daily", testenv.UUID7(t, today.AddDate(0, 0, 2).Add(time.Hour)), "daily"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dedup.Claim{Consumer: "ledger", MessageID: tc.id, Topic: "payments", Partition: 3, Offset: 40}
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
				t.Fatal("ClaimedAt of the committed claim: false")
			}
			for name, other := range map[string]func(*dedup.Claim){
				"offset":    func(c *dedup.Claim) { c.Offset++ },
				"partition": func(c *dedup.Claim) { c.Partition = 4 },
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
	claimAll := func(consumer string, partition int, n int, next int64, ahead bool) {
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
			if _, err := tx.Exec(ctx, `UPDATE `+positions+` SET next_offset = $3, claims_ahead = $4
				WHERE consumer = $1 AND kafka_partition = $2`, consumer, partition, next, ahead); err != nil {
				t.Fatal(err)
			}
		})
	}
	left := func(consumer string, partition int) int {
		t.Helper()
		return count(t, db.Pool, `SELECT count(*) FROM `+processed+` WHERE consumer = $1 AND kafka_partition = $2`, consumer, partition)
	}
	claimAll("billing", 0, 10, 6, true)  // offsets 6..9 lie past the position
	claimAll("billing", 1, 10, 6, false) // no mark: all old
	claimAll("audit", 0, 10, 3, true)

	n, err := s.PurgeConsumer(ctx, db.Pool, "billing", time.Hour, 3)
	if err != nil || n != 16 {
		t.Fatalf("PurgeConsumer(billing) = %d, %v; want 16, nil", n, err)
	}
	if l0, l1, la := left("billing", 0), left("billing", 1), left("audit", 0); l0 != 4 || l1 != 0 || la != 10 {
		t.Fatalf("left after PurgeConsumer: billing/0 %d, billing/1 %d, audit/0 %d; want 4, 0, 10", l0, l1, la)
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
