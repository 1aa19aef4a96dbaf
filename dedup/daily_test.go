package dedup_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

func noon(day time.Time) time.Time { return day.Add(12 * time.Hour) }

// whereStored reports which table holds consumer's claim of id: "flat",
// "daily" or "" (none), failing when both do.
func whereStored(t *testing.T, db *testenv.DB, consumer, id string) string {
	t.Helper()
	flat := count(t, db.Pool, `SELECT count(*) FROM `+db.Table(migrate.ProcessedMessagesDefault)+`
		WHERE consumer = $1 AND (message_id = $2 OR message_uuid::text = $2)`, consumer, id)
	daily := count(t, db.Pool, `SELECT count(*) FROM `+db.Table(migrate.DerivedName(migrate.ProcessedMessagesDefault, "_daily"))+`
		WHERE consumer = $1 AND message_uuid::text = $2`, consumer, id)
	switch {
	case flat+daily > 1:
		t.Fatalf("%s/%s stored %d times (flat %d, daily %d)", consumer, id, flat+daily, flat, daily)
	case flat == 1:
		return "flat"
	case daily == 1:
		return "daily"
	}
	return ""
}

func claimOne(t *testing.T, db *testenv.DB, s *dedup.Store, c dedup.Claim) (bool, error) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	dup, err := s.ClaimTx(ctx, tx, c)
	if err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, err
	}
	return dup, nil
}

// TestUUID7DayMatchesDatabase: the store's reading of a UUIDv7's day is
// PostgreSQL's, for v7 IDs around day boundaries, and the claim lands in
// that day's partition (the bounds of a partition refuse any other day);
// IDs that are not v7 have none and stay in the flat table.
func TestUUID7DayMatchesDatabase(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	today := testenv.Today(t, db.Pool)
	if _, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{AheadDays: 3}); err != nil {
		t.Fatal(err)
	}
	// The day by another reading: PostgreSQL's, of the hex digits.
	const sqlDayOf = `SELECT CASE WHEN substr(u::text, 15, 1) = '7' AND substr(u::text, 20, 1) IN ('8', '9', 'a', 'b')
		THEN (timestamp '1970-01-01' + ('x' || substr(u::text, 1, 8) || substr(u::text, 10, 4))::bit(48)::bigint
			* interval '1 millisecond')::date END FROM (SELECT $1::uuid AS u) AS id`
	from := today.AddDate(0, 0, 2) // DailyFrom: the day after tomorrow
	for i, at := range []time.Time{
		from, from.Add(-time.Millisecond), from.Add(time.Millisecond), from.Add(24*time.Hour - time.Millisecond),
		from.Add(36 * time.Hour), from.Add(47*time.Hour + 59*time.Minute),
	} {
		id := testenv.UUID7(t, at)
		var sqlDay *time.Time
		if err := db.Pool.QueryRow(ctx, sqlDayOf, id).Scan(&sqlDay); err != nil {
			t.Fatal(err)
		}
		wantDay := time.Date(at.Year(), at.Month(), at.Day(), 0, 0, 0, 0, time.UTC)
		if sqlDay == nil || !sqlDay.Equal(wantDay) {
			t.Fatalf("%d: day(%s) = %v in SQL, want %s", i, id, sqlDay, wantDay)
		}
		// The store routes it by its own reading: the daily table's CHECK
		// (day = the function's) accepts it, and it lands where the day says.
		c := dedup.Claim{Consumer: "c", MessageID: id, Topic: "t", Offset: int64(i)}
		if dup, err := claimOne(t, db, s, c); err != nil || dup {
			t.Fatalf("%d: claim %s (at %s): dup %v, err %v", i, id, at, dup, err)
		}
		want := "daily"
		if wantDay.Before(from) {
			want = "flat"
		}
		if got := whereStored(t, db, "c", id); got != want {
			t.Fatalf("%d: %s (day %s) stored in %q, want %q", i, id, wantDay.Format(time.DateOnly), got, want)
		}
		if want == "daily" {
			var stored time.Time
			if err := db.Pool.QueryRow(ctx, `SELECT day FROM `+db.Table(migrate.DerivedName(migrate.ProcessedMessagesDefault, "_daily"))+
				` WHERE message_uuid = $1`, id).Scan(&stored); err != nil || !stored.Equal(*sqlDay) {
				t.Fatalf("%d: %s stored with day %s (%v), want %s", i, id, stored, err, sqlDay)
			}
		}
	}
	// Not v7: version 4, and a v7 pattern with the wrong variant.
	for _, id := range []string{"0192f5a4-7b2c-4d3e-8f40-0123456789ab", "0192f5a4-7b2c-7d3e-cf40-0123456789ab"} {
		var sqlDay *time.Time
		if err := db.Pool.QueryRow(ctx, sqlDayOf, id).Scan(&sqlDay); err != nil {
			t.Fatal(err)
		}
		if sqlDay != nil {
			t.Fatalf("day(%s) = %v, want NULL (not a UUIDv7)", id, sqlDay)
		}
		if _, err := claimOne(t, db, s, dedup.Claim{Consumer: "c", MessageID: id, Topic: "t"}); err != nil {
			t.Fatal(err)
		}
		if got := whereStored(t, db, "c", id); got != "flat" {
			t.Fatalf("%s stored in %q, want flat", id, got)
		}
	}
}

// TestDailyLayout: enabling the daily layout on a schema in use; where each
// kind of ID goes; duplicates across both tables; a store that read the
// flat layout before the switch; a day without a partition.
func TestDailyLayout(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	today := testenv.Today(t, db.Pool)
	first := today.AddDate(0, 0, 2) // DailyFrom: the day after tomorrow

	// A store that reads the flat layout before the switch and keeps it.
	stale, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := stale.Layout(ctx, db.Pool); err != nil || l.Daily() || !l.DailyFrom.IsZero() {
		t.Fatalf("layout before EnableDaily: %+v, %v; want flat", l, err)
	}

	// Before EnableDaily: a UUIDv7 of today is claimed in the flat table.
	before := testenv.UUID7(t, noon(today))
	if dup, err := claimOne(t, db, s, dedup.Claim{Consumer: "c", MessageID: before, Topic: "t"}); err != nil || dup {
		t.Fatalf("claim before: %v %v", dup, err)
	}

	l, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{KeepDays: 7})
	if err != nil {
		t.Fatalf("EnableDaily: %v", err)
	}
	if !l.Daily() || !l.DailyFrom.Equal(first) || l.KeepDays != 7 || l.AheadDays != dedup.AheadDaysDefault {
		t.Fatalf("layout = %+v, want daily from %s, keep 7, ahead %d", l, first, dedup.AheadDaysDefault)
	}
	parts, err := s.Partitions(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	var days []string
	for _, p := range parts {
		days = append(days, p.Day.Format(time.DateOnly))
	}
	var want []string
	for d := first; !d.After(today.AddDate(0, 0, dedup.AheadDaysDefault)); d = d.AddDate(0, 0, 1) {
		want = append(want, d.Format(time.DateOnly))
	}
	if !slices.Equal(days, want) {
		t.Fatalf("partitions %v, want %v", days, want)
	}
	// Enabling again changes nothing but the settings given: none given,
	// none changed; -1 keeps every partition again.
	if l2, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{}); err != nil || l2 != l {
		t.Fatalf("EnableDaily again: %+v, %v; want %+v", l2, err, l)
	}
	if l2, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{KeepDays: -1, AheadDays: 4}); err != nil || l2.KeepDays != 0 || l2.AheadDays != 4 {
		t.Fatalf("EnableDaily keep -1, ahead 4: %+v, %v", l2, err)
	}
	if l, err = s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{KeepDays: 7, AheadDays: dedup.AheadDaysDefault}); err != nil {
		t.Fatal(err)
	}

	// The stale store claims a UUIDv7 dated DailyFrom: refused with
	// ErrLayoutChanged (never stored in the flat table), then, in the next
	// transaction, claimed in the daily table.
	next := testenv.UUID7(t, noon(first))
	if _, err := claimOne(t, db, stale, dedup.Claim{Consumer: "c", MessageID: next, Topic: "t"}); !errors.Is(err, dedup.ErrLayoutChanged) {
		t.Fatalf("stale store's claim: %v, want ErrLayoutChanged", err)
	}
	if got := whereStored(t, db, "c", next); got != "" {
		t.Fatalf("refused claim stored in %q", got)
	}
	if dup, err := claimOne(t, db, stale, dedup.Claim{Consumer: "c", MessageID: next, Topic: "t"}); err != nil || dup {
		t.Fatalf("stale store's claim again: %v %v", dup, err)
	}
	if got := whereStored(t, db, "c", next); got != "daily" {
		t.Fatalf("claim stored in %q, want daily", got)
	}
	for _, st := range []*dedup.Store{s, stale} {
		if dup, err := claimOne(t, db, st, dedup.Claim{Consumer: "c", MessageID: next, Topic: "t"}); err != nil || !dup {
			t.Fatalf("claim of a daily ID again: dup %v, err %v; want a duplicate", dup, err)
		}
		if dup, err := claimOne(t, db, st, dedup.Claim{Consumer: "c", MessageID: before, Topic: "t"}); err != nil || !dup {
			t.Fatalf("claim of the flat UUIDv7 again: dup %v, err %v; want a duplicate", dup, err)
		}
		for _, id := range []string{before, next} {
			if ok, err := st.Processed(ctx, db.Pool, "c", id); err != nil || !ok {
				t.Fatalf("Processed(%s) = %v, %v", id, ok, err)
			}
		}
	}
	if dup, err := claimOne(t, db, s, dedup.Claim{Consumer: "other", MessageID: next, Topic: "t"}); err != nil || dup {
		t.Fatalf("another consumer's claim: %v %v; want new", dup, err)
	}

	// A batch mixing every kind, with an ID twice; then with a position.
	ids := []string{"order-1", "0192f5a4-7b2c-4d3e-8f40-0123456789ab", testenv.UUID7(t, noon(today)),
		testenv.UUID7(t, noon(first)), testenv.UUID7(t, noon(today.AddDate(0, 0, 3)))}
	ids = append(ids, ids[3])
	var claims []dedup.Claim
	for i, id := range ids {
		claims = append(claims, dedup.Claim{Consumer: "b", MessageID: id, Topic: "t", Partition: 1, Offset: int64(i)})
	}
	var dups []bool
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if dups, err = s.ClaimBatchTx(ctx, tx, claims); err != nil {
			t.Fatal(err)
		}
	})
	if !slices.Equal(dups, []bool{false, false, false, false, false, true}) {
		t.Fatalf("batch duplicates %v", dups)
	}
	for i, wantAt := range []string{"flat", "flat", "flat", "daily", "daily"} {
		if got := whereStored(t, db, "b", ids[i]); got != wantAt {
			t.Fatalf("batch %s stored in %q, want %q", ids[i], got, wantAt)
		}
	}
	inTx(t, db.Pool, func(tx pgx.Tx) {
		if dups, err = s.ClaimBatchTx(ctx, tx, claims); err != nil {
			t.Fatal(err)
		}
	})
	if slices.Contains(dups, false) {
		t.Fatalf("batch again: duplicates %v, want all", dups)
	}
	inTx(t, db.Pool, func(tx pgx.Tx) {
		dup, err := s.ClaimWithPositionTx(ctx, tx, dedup.Claim{Consumer: "b", MessageID: testenv.UUID7(t, noon(first)),
			Topic: "t", Partition: 1, Offset: 40})
		if err != nil || dup {
			t.Fatalf("claim with position: %v %v", dup, err)
		}
	})
	wantPositions(t, positions(t, s, db.Pool, "b", "t"), map[int]int64{1: 41})

	// A day past the partitions created ahead: ErrNoPartition, nothing kept.
	far := testenv.UUID7(t, noon(today.AddDate(0, 0, 30)))
	if _, err := claimOne(t, db, s, dedup.Claim{Consumer: "c", MessageID: far, Topic: "t"}); !errors.Is(err, dedup.ErrNoPartition) {
		t.Fatalf("claim dated in 30 days: %v, want ErrNoPartition", err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.ClaimBatchTx(ctx, tx, []dedup.Claim{{Consumer: "c", MessageID: far, Topic: "t"}, {Consumer: "c", MessageID: "x", Topic: "t"}})
	_ = tx.Rollback(ctx)
	if !errors.Is(err, dedup.ErrNoPartition) {
		t.Fatalf("batch with a claim dated in 30 days: %v, want ErrNoPartition", err)
	}
	if got := whereStored(t, db, "c", "x"); got != "" {
		t.Fatalf("failed batch kept a claim in %q", got)
	}
}

// TestDailyConcurrentClaims: of many transactions claiming the same UUIDv7
// in the daily table at once, exactly one claims it.
func TestDailyConcurrentClaims(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	if _, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{}); err != nil {
		t.Fatal(err)
	}
	id := testenv.UUID7(t, noon(testenv.Today(t, db.Pool).AddDate(0, 0, 2)))
	var wins, dups atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < 8; i++ {
		wg.Go(func() {
			<-start
			tx, err := db.Pool.Begin(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer func() { _ = tx.Rollback(ctx) }()
			dup, err := s.ClaimWithPositionTx(ctx, tx, dedup.Claim{Consumer: "c", MessageID: id, Topic: "t", Offset: int64(i)})
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(20 * time.Millisecond) // hold the claim while the others wait
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
				return
			}
			if dup {
				dups.Add(1)
			} else {
				wins.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if wins.Load() != 1 || dups.Load() != 7 {
		t.Fatalf("%d new claims and %d duplicates, want 1 and 7", wins.Load(), dups.Load())
	}
}

// TestDailyRetention: MaintainPartitions drops the partitions older than
// KeepDays and creates the missing ones; a claim dated in a dropped
// partition fails with ErrPartitionDropped, one in a kept partition is
// deduplicated as before.
func TestDailyRetention(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	today := testenv.Today(t, db.Pool)
	if _, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{AheadDays: 2}); err != nil {
		t.Fatal(err)
	}
	// As if enabled ten days ago (no flat row is that recent a UUIDv7).
	testenv.BackdateDaily(t, db.Pool, db.Schema, 10)
	ch, err := s.MaintainPartitions(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(ch.Created) != 12 || !ch.Created[0].Equal(today.AddDate(0, 0, -10)) || len(ch.Dropped) != 0 {
		t.Fatalf("MaintainPartitions created %v, dropped %v; want the 12 days from %s", ch.Created, ch.Dropped, today.AddDate(0, 0, -10))
	}
	s2, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}}) // reads the new layout
	if err != nil {
		t.Fatal(err)
	}
	old := testenv.UUID7(t, noon(today.AddDate(0, 0, -5)))
	kept := testenv.UUID7(t, noon(today.AddDate(0, 0, -3)))
	for _, id := range []string{old, kept} {
		if dup, err := claimOne(t, db, s2, dedup.Claim{Consumer: "c", MessageID: id, Topic: "t"}); err != nil || dup {
			t.Fatalf("claim %s: %v %v", id, dup, err)
		}
		if got := whereStored(t, db, "c", id); got != "daily" {
			t.Fatalf("%s stored in %q, want daily", id, got)
		}
	}

	// Keep 3 days: every day before today-3 goes; 5 days ahead: 3 more.
	if _, err := s2.EnableDaily(ctx, db.Pool, dedup.DailyConfig{KeepDays: 3, AheadDays: 5}); err != nil {
		t.Fatal(err)
	}
	// Claims keep flowing while partitions are dropped and created.
	stop := make(chan struct{})
	var flowing sync.WaitGroup
	var claimed atomic.Int32
	flowing.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			id := testenv.UUID7(t, noon(today))
			if i%2 == 0 {
				id = testenv.UUID7(t, noon(today.AddDate(0, 0, 1)))
			}
			if _, err := claimOne(t, db, s2, dedup.Claim{Consumer: "flow", MessageID: id, Topic: "t"}); err != nil {
				t.Errorf("claim during maintenance: %v", err)
				return
			}
			claimed.Add(1)
		}
	})
	ch, err = s2.MaintainPartitions(ctx, db.Pool)
	close(stop)
	flowing.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if claimed.Load() == 0 {
		t.Fatal("no claim made while MaintainPartitions ran")
	}
	if len(ch.Dropped) != 7 || !ch.Dropped[6].Equal(today.AddDate(0, 0, -4)) || len(ch.Created) != 3 ||
		!ch.Created[2].Equal(today.AddDate(0, 0, 5)) {
		t.Fatalf("MaintainPartitions dropped %v, created %v; want the 7 days up to %s, and 3 days up to %s",
			ch.Dropped, ch.Created, today.AddDate(0, 0, -4), today.AddDate(0, 0, 5))
	}
	parts, err := s2.Partitions(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 9 || !parts[0].Day.Equal(today.AddDate(0, 0, -3)) {
		t.Fatalf("partitions after the drop: %v, want 9 from %s", parts, today.AddDate(0, 0, -3))
	}
	if _, err := claimOne(t, db, s2, dedup.Claim{Consumer: "c", MessageID: old, Topic: "t"}); !errors.Is(err, dedup.ErrPartitionDropped) {
		t.Fatalf("claim in a dropped partition: %v, want ErrPartitionDropped", err)
	}
	if dup, err := claimOne(t, db, s2, dedup.Claim{Consumer: "c", MessageID: kept, Topic: "t"}); err != nil || !dup {
		t.Fatalf("claim in a kept partition: %v %v, want a duplicate", dup, err)
	}
	if ch, err := s2.MaintainPartitions(ctx, db.Pool); err != nil || len(ch.Created)+len(ch.Dropped) != 0 {
		t.Fatalf("MaintainPartitions again: %+v, %v; want nothing to do", ch, err)
	}
}

// TestEnableDailyRefused: a flat table that already holds a UUIDv7 dated
// from tomorrow (a producer's clock ahead) refuses the switch and is left
// as it was: such IDs are still claimed in the flat table.
func TestEnableDailyRefused(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	ahead := testenv.UUID7(t, noon(testenv.Today(t, db.Pool).AddDate(0, 0, 2)))
	if _, err := claimOne(t, db, s, dedup.Claim{Consumer: "c", MessageID: ahead, Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnableDaily(ctx, db.Pool, dedup.DailyConfig{}); !errors.Is(err, dedup.ErrDailyRefused) {
		t.Fatalf("EnableDaily: %v, want ErrDailyRefused", err)
	}
	s2, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s2.Layout(ctx, db.Pool); err != nil || !l.DailyFrom.IsZero() {
		t.Fatalf("layout after a refused switch: %+v, %v; want flat", l, err)
	}
	other := testenv.UUID7(t, noon(testenv.Today(t, db.Pool).AddDate(0, 0, 2)))
	if dup, err := claimOne(t, db, s2, dedup.Claim{Consumer: "c", MessageID: other, Topic: "t"}); err != nil || dup {
		t.Fatalf("claim after a refused switch: %v %v", dup, err)
	}
	if got := whereStored(t, db, "c", other); got != "flat" {
		t.Fatalf("stored in %q, want flat", got)
	}
}

// TestProcessedSeesASwitchByAnother: Processed of a UUIDv7 reads the
// layout again, so a store that read the flat layout before another
// process switched still finds a claim stored in the daily table.
func TestProcessedSeesASwitchByAnother(t *testing.T) {
	db, s := newStore(t)
	ctx := context.Background()
	id := testenv.UUID7(t, noon(testenv.Today(t, db.Pool).AddDate(0, 0, 2)))
	if ok, err := s.Processed(ctx, db.Pool, "c", id); err != nil || ok {
		t.Fatalf("Processed before: %v %v", ok, err)
	}
	other, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.EnableDaily(ctx, db.Pool, dedup.DailyConfig{}); err != nil {
		t.Fatal(err)
	}
	if _, err := claimOne(t, db, other, dedup.Claim{Consumer: "c", MessageID: id, Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	if got := whereStored(t, db, "c", id); got != "daily" {
		t.Fatalf("stored in %q, want daily", got)
	}
	if ok, err := s.Processed(ctx, db.Pool, "c", id); err != nil || !ok {
		t.Fatalf("Processed by the store that read the flat layout: %v %v, want true", ok, err)
	}
}
