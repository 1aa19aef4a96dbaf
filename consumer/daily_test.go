package consumer_test

import (
	"context"
	"errors"
	"fmt"
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

// TestDailyLayoutWhileRunning: a runner that started on the flat layout
// keeps every message exactly once across the switch to the daily layout
// (its first claim the switch moved is refused, and runs again under the
// new layout); IDs of a dropped day go to OnFailure as beyond the horizon
// without being applied; an ID dated past the partitions made ahead is
// retried, then goes to OnFailure; the others are applied once, where
// their day says.
func TestDailyLayoutWhileRunning(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, 1)
			var today time.Time
			if err := e.db.Pool.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today); err != nil {
				t.Fatal(err)
			}
			day := func(n int) time.Time { return today.AddDate(0, 0, n).Add(12 * time.Hour) }

			// Claimed before, in the flat table: a duplicate later.
			flatDup := testenv.UUID7(t, day(-20))
			if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
				_, err := e.store.ClaimTx(ctx, tx, dedup.Claim{Consumer: e.group, MessageID: flatDup, Topic: e.topic})
				return err
			}); err != nil {
				t.Fatal(err)
			}

			notes := newHorizonNotes()
			// The runner keeps the hooks it started with: this one passes
			// the outcomes on to the set of the moment.
			var cur atomic.Pointer[outcomes]
			oc := newOutcomes(2)
			cur.Store(oc)
			cfg := e.config(md, nil)
			cfg.OnFailure = notes.onFailure
			testobs.Of(cfg).OnOutcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) { cur.Load().hook(ctx, m, o) }
			testobs.Of(cfg).OnBeyondHorizon = notes.hook
			stop := run(t, e.db.Pool, cfg)
			flatNew := testenv.UUID7(t, day(-20))
			e.produce(msg(flatNew, "a", 1), msg(flatDup, "b", 1))
			wait(t, oc.done, "the flat layout's two outcomes")

			// The switch, by another store (as `idemkit dedup daily enable`
			// would): the runner's store still holds the flat layout. Then,
			// as if it had been enabled ten days ago, keeping 3 days.
			other, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: e.db.Schema}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := other.EnableDaily(ctx, e.db.Pool, dedup.DailyConfig{KeepDays: 3}); err != nil {
				t.Fatal(err)
			}
			testenv.BackdateDaily(t, e.db.Pool, e.db.Schema, 10)
			if _, err := other.MaintainPartitions(ctx, e.db.Pool); err != nil {
				t.Fatal(err)
			}

			next := testenv.UUID7(t, day(2))    // daily, dated DailyFrom: the flat table refuses it to the runner's stale layout
			kept := testenv.UUID7(t, day(-2))   // daily, a kept day
			gone := testenv.UUID7(t, day(-5))   // a day not kept
			far := testenv.UUID7(t, day(30))    // past the days made ahead
			older := testenv.UUID7(t, day(-15)) // before the daily layout's first day: flat
			oc2 := newOutcomes(8)
			cur.Store(oc2)
			e.produce(msg(next, "c", 1), msg(next, "c", 1), msg(kept, "d", 1), msg(gone, "e", 1),
				msg(far, "f", 1), msg("order-7", "g", 1), msg(older, "h", 1), msg(flatDup, "b", 1))
			wait(t, oc2.done, "eight outcomes after the switch")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}

			runs := e.runs()
			oc2.mu.Lock()
			defer oc2.mu.Unlock()
			want := map[string][]consumer.Outcome{
				next: {consumer.Applied, consumer.Duplicate}, kept: {consumer.Applied}, gone: {consumer.Failed},
				far: {consumer.Failed}, "order-7": {consumer.Applied}, older: {consumer.Applied}, flatDup: {consumer.Duplicate},
			}
			for id, w := range want {
				if got := oc2.ids[id]; fmt.Sprint(got) != fmt.Sprint(w) {
					t.Errorf("%s: outcomes %v, want %v", id, got, w)
				}
			}
			for id, n := range map[string]int{flatNew: 1, next: 1, kept: 1, gone: 0, far: 0, "order-7": 1, older: 1, flatDup: 0} {
				if runs[id] != n {
					t.Errorf("%s: effect ran %d times, want %d", id, runs[id], n)
				}
			}
			notes.mu.Lock()
			defer notes.mu.Unlock()
			var herr *consumer.HorizonError
			if err := notes.failed[gone]; !errors.Is(err, dedup.ErrPartitionDropped) || !errors.Is(err, consumer.ErrBeyondHorizon) ||
				!errors.As(err, &herr) || herr.Horizon != 72*time.Hour {
				t.Errorf("OnFailure for the dropped day: %v; want ErrBeyondHorizon and dedup.ErrPartitionDropped, horizon 72h", err)
			}
			if got := notes.hooked[gone]; len(got) != 1 || got[0] {
				t.Errorf("BeyondHorizon hook for the dropped day: %v, want one call, not applied", got)
			}
			var merr *consumer.MessageError
			if err := notes.failed[far]; !errors.Is(err, dedup.ErrNoPartition) || !errors.As(err, &merr) || merr.Attempts < 2 {
				t.Errorf("OnFailure for the day past the partitions: %v; want dedup.ErrNoPartition after retries", err)
			}
			daily := pgx.Identifier{e.db.Schema, migrate.DerivedName(migrate.ProcessedMessagesDefault, "_daily")}.Sanitize()
			var inDaily int
			if err := e.db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+daily+` WHERE consumer = $1 AND message_uuid = ANY ($2::uuid[])`,
				e.group, []string{next, kept}).Scan(&inDaily); err != nil {
				t.Fatal(err)
			}
			if inDaily != 2 {
				t.Errorf("%d of the two daily IDs are in the daily table", inDaily)
			}
		})
	}
}
