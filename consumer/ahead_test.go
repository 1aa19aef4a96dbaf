package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// position reads the env's stored position of partition 0.
func (e *env) position(name string) (next int64, ahead bool) {
	e.t.Helper()
	list, err := e.store.ListPositions(context.Background(), e.db.Pool, name, e.topic)
	if err != nil {
		e.t.Fatal(err)
	}
	if len(list) != 1 {
		e.t.Fatalf("positions: %+v, want one", list)
	}
	return list[0].Next, list[0].ClaimsAhead
}

// TestPositionMovedOncePerChain: with one transaction per message and a
// backlog, the transactions chained after the first claim without moving
// the position, which the first transaction after the chain moves past
// them: about one move per chain instead of one per message. The position
// is exact once Run returns, and says claims may lie past it.
func TestPositionMovedOncePerChain(t *testing.T) {
	t.Parallel()
	const n = 300
	e := newEnv(t, 1)
	ctx := context.Background()
	positions := e.db.Table(migrate.ConsumerPositionsDefault)
	moves, count := e.db.Table("position_moves"), e.db.Table("count_move")
	for _, q := range []string{
		`CREATE TABLE ` + moves + ` (n int NOT NULL)`,
		`INSERT INTO ` + moves + ` VALUES (0)`,
		`CREATE FUNCTION ` + count + `() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN UPDATE ` + moves + ` SET n = n + 1; RETURN NULL; END $$`,
		`CREATE TRIGGER count_move AFTER UPDATE ON ` + positions + ` FOR EACH ROW
		WHEN (OLD.next_offset IS DISTINCT FROM NEW.next_offset) EXECUTE FUNCTION ` + count + `()`,
	} {
		if _, err := e.db.Pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	e.backlog(n)
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, 4)
	e.runAll(pool, e.config(mode{batch: 1}, nil), n)

	chained, errs := tr.counts()
	var moved int
	if err := e.db.Pool.QueryRow(ctx, `SELECT n FROM `+moves).Scan(&moved); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages, %d transactions chained, %d position moves", n, chained, moved)
	if len(errs) > 0 {
		t.Fatalf("chained batches failed: %v", errs)
	}
	if chained < n/2 {
		t.Fatalf("%d of %d transactions chained: the backlog did not chain", chained, n)
	}
	if moved > n/4 {
		t.Fatalf("the position moved %d times for %d messages (%d chained): once per message, not per chain", moved, n, chained)
	}
	if next, ahead := e.position(e.group); next != n || !ahead {
		t.Fatalf("position after Run: %d, ClaimsAhead %v; want %d, true", next, ahead, n)
	}
}

// TestClaimsAheadPassedAtStart: a runner starting at a position that says
// claims lie past it passes the messages claimed at their very
// coordinates silently (no outcome, no effect), up to the first one that
// was not (here a true duplicate: its ID was claimed at another offset),
// which it processes as usual. Without the mark they come back as
// duplicates.
func TestClaimsAheadPassedAtStart(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		for _, ahead := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/claims ahead %v", md.name, ahead), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				e := newEnv(t, 1)
				e.backlog(20)
				e.produce(msg("m-5", "k5", 1)) // offset 20: a producer's retry
				oc := newOutcomes(21)
				cfg := e.config(md, nil)
				cfg.Hooks.Outcome = oc.hook
				stop := run(t, e.db.Pool, cfg)
				wait(t, oc.done, "the first 21 messages")
				if err := stop(); err != nil {
					t.Fatalf("Run: %v", err)
				}
				if d := oc.count(consumer.Duplicate); d != 1 {
					t.Fatalf("first run: %d duplicates, want 1", d)
				}

				// As if the runner had stopped after claiming 15..20 without
				// moving the position past 15, last written with 14's claim.
				if _, err := e.db.Pool.Exec(ctx, `UPDATE `+e.db.Table(migrate.ConsumerPositionsDefault)+`
				SET next_offset = 15, anchor_time = NULL, anchor_offset = NULL, claims_ahead = $1,
					updated_at = (SELECT processed_at FROM `+e.db.Table(migrate.ProcessedMessagesDefault)+` WHERE kafka_offset = 14)`,
					ahead); err != nil {
					t.Fatal(err)
				}
				var more []kafka.Message
				for i := 21; i < 24; i++ {
					more = append(more, msg(fmt.Sprintf("m-%d", i), "k", 1))
				}
				e.produce(more...)

				want := 4 // m-5 again (offset 20), then m-21..m-23
				if !ahead {
					want += 5 // m-15..m-19
				}
				oc = newOutcomes(want)
				cfg = e.config(md, nil)
				cfg.Name, cfg.GroupID = cfg.GroupID, testenv.Name(t, "other") // no Kafka offsets: start at the position
				cfg.Hooks.Outcome = oc.hook
				stop = run(t, e.db.Pool, cfg)
				wait(t, oc.done, "the messages after the position")
				if err := stop(); err != nil {
					t.Fatalf("Run: %v", err)
				}
				oc.mu.Lock()
				ids := oc.ids
				oc.mu.Unlock()
				for i := 15; i < 20; i++ {
					id := fmt.Sprintf("m-%d", i)
					switch got := ids[id]; {
					case ahead && len(got) != 0:
						t.Errorf("%s reported %v; want passed silently", id, got)
					case !ahead && (len(got) != 1 || got[0] != consumer.Duplicate):
						t.Errorf("%s reported %v; want a duplicate", id, got)
					}
				}
				if got := ids["m-5"]; len(got) != 1 || got[0] != consumer.Duplicate {
					t.Errorf("m-5 at offset 20 reported %v; want a duplicate (claimed at offset 5)", got)
				}
				for i := 21; i < 24; i++ {
					if id := fmt.Sprintf("m-%d", i); len(ids[id]) != 1 || ids[id][0] != consumer.Applied {
						t.Errorf("%s reported %v; want applied", id, ids[id])
					}
				}
				runs := e.runs()
				for i := range 24 {
					if id := fmt.Sprintf("m-%d", i); i != 20 && runs[id] != 1 { // no m-20: offset 20 is m-5
						t.Errorf("%s ran %d times, want 1", id, runs[id])
					}
				}
				if next, _ := e.position(cfg.Name); next != 24 {
					t.Errorf("position after the second run: %d, want 24", next)
				}
			})
		}
	}
}

// TestDuplicateInChainMovesThePosition: a duplicate claimed by a chained
// transaction moves the position with it, so that a restart right after
// does not report it again (ClaimedAt finds no claim at its coordinates),
// while the other chained transactions leave it behind.
func TestDuplicateInChainMovesThePosition(t *testing.T) {
	t.Parallel()
	const n = 120
	e := newEnv(t, 1)
	msgs := make([]kafka.Message, n)
	dups := map[int64]bool{}
	for i := range msgs {
		msgs[i] = msg(fmt.Sprintf("m-%d", i), "k", 1)
		if i >= 40 && i%10 == 5 {
			msgs[i] = msg(fmt.Sprintf("m-%d", i-31), "k", 1) // a producer's retry
			dups[int64(i)] = true
		}
	}
	e.produce(msgs...)
	var mu sync.Mutex
	after := map[int64]int64{} // offset → the position right after its commit
	cfg := e.config(mode{batch: 1}, nil)
	cfg.Hooks.AfterCommit = func(ctx context.Context, ms []*consumer.Message) {
		var next int64
		if err := e.db.Pool.QueryRow(ctx, `SELECT next_offset FROM `+e.db.Table(migrate.ConsumerPositionsDefault)).Scan(&next); err != nil {
			t.Error(err)
		}
		mu.Lock()
		after[ms[0].Offset] = next
		mu.Unlock()
	}
	tr := &chainTracer{}
	pool, _ := tracedPool(t, tr, 4)
	oc := newOutcomes(n)
	cfg.Hooks.Outcome = oc.hook
	r, err := consumer.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := runRunner(t, r)
	wait(t, oc.done, "all messages")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if d := oc.count(consumer.Duplicate); d != len(dups) {
		t.Fatalf("%d duplicates, want %d", d, len(dups))
	}
	mu.Lock()
	defer mu.Unlock()
	behind := 0
	for off, next := range after {
		switch {
		case dups[off] && next <= off:
			t.Errorf("position right after the duplicate at offset %d committed: %d, want %d or more", off, next, off+1)
		case !dups[off] && next <= off:
			behind++
		}
	}
	if behind < n/2 {
		t.Fatalf("the position was behind the message just committed %d times of %d: chained claims moved it", behind, n)
	}
}

// TestPositionCaughtUpWhenIdle: once a backlog is done and the partition
// waits for messages, the position is past the last one while the runner
// still runs (the chained claims before it left it behind).
func TestPositionCaughtUpWhenIdle(t *testing.T) {
	t.Parallel()
	const n = 100
	e := newEnv(t, 1)
	e.backlog(n)
	oc := newOutcomes(n)
	cfg := e.config(mode{batch: 1}, nil)
	cfg.Hooks.Outcome = oc.hook
	stop := run(t, e.db.Pool, cfg)
	wait(t, oc.done, "all messages")
	deadline := time.Now().Add(10 * time.Second)
	for {
		next, ahead := e.position(e.group)
		if next == n && ahead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("position %d (ClaimsAhead %v) 10 s after the last of %d messages was reported, the runner idle", next, ahead, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkOnce(n)
}

// TestPositionCaughtUpDuringRetry: while a message is retried in place,
// the position is past the messages before it, although they were claimed
// by chained transactions that left it behind.
func TestPositionCaughtUpDuringRetry(t *testing.T) {
	t.Parallel()
	const n, failing = 60, 40
	e := newEnv(t, 1)
	e.backlog(n)
	var mu sync.Mutex
	calls := 0
	var seen []int64 // the position at each attempt after the first
	cfg := e.config(mode{batch: 1}, func(ctx context.Context, m *consumer.Message) error {
		if m.ID != fmt.Sprintf("m-%d", failing) {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls > 1 {
			var next int64
			if err := e.db.Pool.QueryRow(ctx, `SELECT next_offset FROM `+e.db.Table(migrate.ConsumerPositionsDefault)).Scan(&next); err != nil {
				t.Error(err)
			}
			seen = append(seen, next)
		}
		if calls <= 3 {
			return fmt.Errorf("attempt %d fails", calls)
		}
		return nil
	})
	oc := newOutcomes(n)
	cfg.Hooks.Outcome = oc.hook
	stop := run(t, e.db.Pool, cfg)
	wait(t, oc.done, "all messages")
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkOnce(n)
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Fatalf("m-%d attempted %d times after the first, want 3", failing, len(seen))
	}
	for i, next := range seen {
		if next != failing {
			t.Errorf("attempt %d of m-%d: position %d, want %d (the messages before it are done)", i+2, failing, next, failing)
		}
	}
}
