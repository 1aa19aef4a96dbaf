package idemotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// eventually collects until ok accepts the values of the named metric, or
// fails the test after 30s.
func (e *env) eventually(name, what string, ok func(map[string]float64) bool) map[string]float64 {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := points(e.t, e.collect(), name)
		if ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: %v, want %s", name, got, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// observed wires the telemetry into cfg, makes its runner and observes it.
func (e *env) observed(cfg *consumer.Config) (*idemotel.Consumer, *consumer.Runner) {
	e.t.Helper()
	c, err := e.tel.Consumer(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := c.Observe(r); err != nil {
		e.t.Fatal(err)
	}
	return c, r
}

// blockOn is a handler that, for the message with ID id, signals blocked
// and waits for release (or its context) before applying the effect.
func (e *env) blockOn(id string, blocked chan<- struct{}, release <-chan struct{}) consumer.HandlerFunc {
	return func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == id {
			select {
			case blocked <- struct{}{}:
			default:
			}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return e.effect(ctx, tx, m)
	}
}

// TestLagAndPositionFollowABlockedHandler: while the handler is blocked on
// the second of six messages, a Monitor reports the partition's lag 5 and
// its position 1, and the runner that it holds one partition; once it is
// released, the lag is 0 and the position 6. After Close the runner's gauge
// is gone.
func TestLagAndPositionFollowABlockedHandler(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("a", "k"), msg("b", "k"), msg("c", "k"), msg("d", "k"), msg("e", "k"), msg("f", "k"))
	release := make(chan struct{})
	blocked := make(chan struct{}, 1)
	cfg := e.config(e.blockOn("b", blocked, release)) // a commits: the consumer has a position
	cfg.BatchSize = 1
	oc := newOutcomes(6)
	testobs.Of(cfg).OnOutcome = oc.hook
	c, r := e.observed(cfg)
	if err := c.Observe(r); err == nil {
		t.Error("a second Observe succeeded")
	}
	stop := run(t, r)
	wait(t, blocked, "the handler to block")
	e.runMonitor(idemotel.MonitorConfig{})

	part := lbl("consumer", e.group, "partition", "0", "topic", e.topic)
	e.eventually("idemkit.consumer.lag", "lag 5 while blocked", func(m map[string]float64) bool { return m[part] == 5 })
	if got := points(t, e.collect(), "idemkit.consumer.position"); got[part] != 1 || len(got) != 1 {
		t.Errorf("position while blocked = %v, want 1", got)
	}
	close(release)
	wait(t, oc.done, "6 outcomes")
	e.eventually("idemkit.consumer.lag", "lag 0 once released", func(m map[string]float64) bool { return m[part] == 0 })
	rm := e.collect()
	if got := points(t, rm, "idemkit.consumer.position"); got[part] != 6 {
		t.Errorf("position after = %v, want 6", got)
	}
	base := lbl("consumer", e.group, "topic", e.topic)
	e.eventually("idemkit.consumer.parked_messages", "0 parked, from the Monitor", func(m map[string]float64) bool {
		v, ok := m[base]
		return ok && v == 0 && len(m) == 1
	})
	if got := points(t, rm, "idemkit.consumer.partitions_held"); got[base] != 1 || len(got) != 1 {
		t.Errorf("partitions held = %v, want 1", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := points(t, e.collect(), "idemkit.consumer.partitions_held"); len(got) != 0 {
		t.Errorf("partitions held after Close = %v, want nothing", got)
	}
}

// TestParkedGauges: in NonBlocking mode a failing message and the later
// message of its key are parked; the gauges count them and age the oldest.
func TestParkedGauges(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("p1", "stuck"), msg("x", "other"), msg("p2", "stuck"))
	cfg := e.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		if m.ID == "p1" {
			return errors.New("still failing")
		}
		return e.effect(ctx, tx, m)
	})
	cfg.BatchSize = 1
	cfg.FailureMode = consumer.NonBlocking
	cfg.Retry.MaxAttempts = 1
	cfg.ParkedRetry = retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour}
	parked := make(chan struct{}, 3)
	testobs.Of(cfg).OnOutcome = func(_ context.Context, _ *consumer.Message, o consumer.Outcome) {
		if o == consumer.Parked {
			parked <- struct{}{}
		}
	}
	c, r := e.observed(cfg)
	defer c.Close()
	run(t, r)
	wait(t, parked, "p1 parked")
	wait(t, parked, "p2 parked")

	base := lbl("consumer", e.group, "topic", e.topic)
	e.runMonitor(idemotel.MonitorConfig{})
	e.eventually("idemkit.consumer.parked_oldest_age", "a few seconds", func(m map[string]float64) bool { return m[base] > 0 && m[base] < 60 })
	e.eventually("idemkit.consumer.parked_messages", "2 parked, from the table", func(m map[string]float64) bool { return m[base] == 2 })
	rm := e.collect()
	want := map[string]float64{
		lbl("consumer", e.group, "topic", e.topic, "outcome", "parked"):    2,
		lbl("consumer", e.group, "topic", e.topic, "outcome", "applied"):   1,
		lbl("consumer", e.group, "topic", e.topic, "outcome", "duplicate"): 0,
		lbl("consumer", e.group, "topic", e.topic, "outcome", "failed"):    0,
	}
	got := points(t, rm, "idemkit.consumer.messages")
	for k, v := range want {
		if got[k] != v {
			t.Errorf("messages = %v, want %v", got, want)
			break
		}
	}
}

// TestDailyPartitionsAheadGauge: with the daily layout, a Monitor's gauge says how
// many days of partitions lie ahead, and drops when the newest goes.
func TestDailyPartitionsAheadGauge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 1)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.EnableDaily(ctx, e.db.Pool, dedup.DailyConfig{AheadDays: 2}); err != nil {
		t.Fatal(err)
	}
	// A consumer with a position.
	if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		return store.SavePositionTx(ctx, tx, e.group, e.topic, 0, 0, time.Time{}, 0)
	}); err != nil {
		t.Fatal(err)
	}
	e.runMonitor(idemotel.MonitorConfig{})
	schema := lbl("schema", e.db.Schema)
	e.eventually("idemkit.dedup.daily_partitions_ahead", "2 days", func(m map[string]float64) bool { return m[schema] == 2 })
	parts, err := store.Partitions(ctx, e.db.Pool)
	if err != nil || len(parts) == 0 {
		t.Fatalf("partitions: %v %v", parts, err)
	}
	if _, err := e.db.Pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{e.db.Schema, parts[len(parts)-1].Name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	e.eventually("idemkit.dedup.daily_partitions_ahead", "1 day once the newest is gone", func(m map[string]float64) bool { return m[schema] == 1 })
}
