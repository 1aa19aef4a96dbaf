package dlq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestRedriveDeadLetterOfDroppedDay: dead letters are replayed days after
// they failed. With the daily layout, a dead letter whose ID's day was
// dropped meanwhile (DailyConfig.KeepDays) cannot be claimed
// (dedup.ErrPartitionDropped): Redrive reports it as BeyondHorizon, does not
// run it, and goes on, so the dead letters behind it (here a text ID that
// the daily layout does not concern) are replayed. A run that stopped at
// that error would stop there every time and never replay them.
func TestRedriveDeadLetterOfDroppedDay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	var today time.Time
	if err := e.db.Pool.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&today); err != nil {
		t.Fatal(err)
	}
	admin, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.EnableDaily(ctx, e.db.Pool, dedup.DailyConfig{AheadDays: 2}); err != nil {
		t.Fatal(err)
	}
	// As if enabled ten days ago.
	testenv.BackdateDaily(t, e.db.Pool, e.db.Schema, 10)
	if _, err := admin.MaintainPartitions(ctx, e.db.Pool); err != nil {
		t.Fatal(err)
	}
	old := testenv.UUID7(t, today.AddDate(0, 0, -2).Add(12*time.Hour))
	e.produce(old, "order-1")
	e.consume(2, func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })
	if n := len(e.deadLetters()); n != 2 {
		t.Fatalf("%d dead letters, want 2", n)
	}
	// Days pass; retention keeps one day: old's day is dropped.
	if _, err := admin.EnableDaily(ctx, e.db.Pool, dedup.DailyConfig{KeepDays: 1, AheadDays: 2}); err != nil {
		t.Fatal(err)
	}
	if ch, err := admin.MaintainPartitions(ctx, e.db.Pool); err != nil || len(ch.Dropped) == 0 {
		t.Fatalf("maintain: %+v %v", ch, err)
	}
	sum, err := e.reprocessor(dlq.Redrive, e.effect, nil).Run(ctx)
	if err != nil {
		t.Errorf("redrive run stopped: %v (summary %v)", err, sum)
	}
	if sum.Records[dlq.BeyondHorizon] != 1 || sum.Records[dlq.Applied] != 1 {
		t.Errorf("summary %v, want 1 beyond-horizon and 1 applied", sum)
	}
	if runs := e.runs(); runs[old] != 0 {
		t.Errorf("%s ran %d times, want 0: its claim cannot be recorded", old, runs[old])
	}
	if runs := e.runs(); runs["order-1"] != 1 {
		t.Errorf("order-1 ran %d times after the redrive, want 1", runs["order-1"])
	}
}
