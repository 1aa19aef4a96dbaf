package idemotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/monitor"
)

// runMonitor starts a Monitor of the env's schema, collecting every 20ms,
// stopped and closed when the test ends.
func (e *env) runMonitor(cfg idemotel.MonitorConfig) *idemotel.Monitor {
	e.t.Helper()
	cfg.Kafka = testenv.Kafka(e.t)
	cfg.Tables.Schema = e.db.Schema
	if cfg.Interval == 0 {
		cfg.Interval = 20 * time.Millisecond
	}
	cfg.StuckInterval = cfg.Interval
	m, err := e.tel.Monitor(e.db.Pool, &cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("Monitor.Run: %v", err)
		}
		_ = m.Close()
	})
	return m
}

// TestMonitorSeesAStoppedConsumer: once the consumer stopped, its runner's
// gauges are gone, and a Monitor still reports its lag growing, its
// position, its oldest processed record against the retention, and how
// old its collection is.
func TestMonitorSeesAStoppedConsumer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("a", "k"), msg("b", "k"))
	cfg := e.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error { return e.effect(ctx, tx, m) })
	oc := newOutcomes(2)
	testobs.Of(cfg).OnOutcome = oc.hook
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	wait(t, oc.done, "2 outcomes")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	e.produce(msg("c", "k"), msg("d", "k"), msg("e", "k"))

	e.runMonitor(idemotel.MonitorConfig{})
	part := lbl("consumer", e.group, "partition", "0", "topic", e.topic)
	e.eventually("idemkit.consumer.lag", "3 with no runner", func(m map[string]float64) bool { return m[part] == 3 })
	rm := e.collect()
	if got := points(t, rm, "idemkit.consumer.position"); got[part] != 2 {
		t.Errorf("position = %v, want 2", got)
	}
	if got := points(t, rm, "idemkit.consumer.partitions_held"); len(got) != 0 {
		t.Errorf("partitions held with no runner = %v, want nothing", got)
	}
	consumerOnly := lbl("consumer", e.group)
	if got := points(t, rm, "idemkit.dedup.retention"); got[consumerOnly] != idemotel.RetentionDefault.Seconds() {
		t.Errorf("retention = %v, want the default, %v", got, idemotel.RetentionDefault.Seconds())
	}
	if got, ok := points(t, rm, "idemkit.dedup.oldest_record_age")[consumerOnly]; !ok || got <= 0 || got > 60 {
		t.Errorf("oldest record age = %v (present %v), want a few seconds", got, ok)
	}
	if got, ok := points(t, rm, "idemkit.monitor.snapshot_age")[""]; !ok || got < 0 || got > 30 {
		t.Errorf("snapshot age = %v (present %v)", got, ok)
	}
	if got := points(t, rm, "idemkit.monitor.collections"); got[lbl("outcome", "ok")] < 1 || got[lbl("outcome", "failed")] != 0 {
		t.Errorf("collections = %v, want ok ≥ 1, failed 0", got)
	}
}

// TestMonitorFailures: a Monitor that cannot reach PostgreSQL counts its
// failed collections and, having collected nothing, exports no value (not
// zeros that an alert would take for health); a config without brokers
// is refused.
func TestMonitorFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := e.tel.Monitor(pool, &idemotel.MonitorConfig{}); !errors.Is(err, monitor.ErrInvalidConfig) {
		t.Fatalf("Monitor without brokers: %v, want monitor.ErrInvalidConfig", err)
	}
	m, err := e.tel.Monitor(pool, &idemotel.MonitorConfig{Config: monitor.Config{Kafka: testenv.Kafka(t)},
		Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	e.eventually("idemkit.monitor.collections", "2 failed", func(got map[string]float64) bool { return got[lbl("outcome", "failed")] >= 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v, want nil once its context ended", err)
	}
	rm := e.collect()
	for _, name := range []string{"idemkit.monitor.snapshot_age", "idemkit.consumer.lag", "idemkit.outbox.backlog_messages"} {
		if got := points(t, rm, name); len(got) != 0 {
			t.Errorf("%s before any collection = %v, want nothing", name, got)
		}
	}
}

// A Monitor runs with the others of a service under idemkit.RunAll.
var _ idemkit.Runner = (*idemotel.Monitor)(nil)

// TestRunnerAndMonitorInOneProcess: a partition a runner of this process
// holds is reported by the runner (its live lag), not by the Monitor (the
// tables): one source per series. Here the table says 0 (its position row
// moved behind the runner's back, once the blocked transaction that locks
// it timed out) while the runner, blocked again, knows 5.
func TestRunnerAndMonitorInOneProcess(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("a", "k"), msg("b", "k"), msg("c", "k"), msg("d", "k"), msg("e", "k"), msg("f", "k"))
	release := make(chan struct{})
	blocked := make(chan struct{}, 1)
	cfg := e.config(e.blockOn("b", blocked, release))
	cfg.BatchSize = 1
	cfg.HandlerTimeout = time.Second
	c, r := e.observed(cfg)
	defer c.Close()
	stop := run(t, r)
	defer func() { close(release); _ = stop() }()
	wait(t, blocked, "the handler to block")
	part := lbl("consumer", e.group, "partition", "0", "topic", e.topic)
	e.eventually("idemkit.consumer.lag", "the runner's lag 5", func(m map[string]float64) bool { return m[part] == 5 })
	if _, err := e.db.Pool.Exec(context.Background(), `UPDATE `+e.db.Table("consumer_positions")+` SET next_offset = 6`); err != nil {
		t.Fatal(err)
	}
	e.runMonitor(idemotel.MonitorConfig{})
	e.eventually("idemkit.monitor.snapshot_age", "a collection", func(m map[string]float64) bool { _, ok := m[""]; return ok })
	for range 20 {
		if got := points(t, e.collect(), "idemkit.consumer.lag")[part]; got != 5 {
			t.Fatalf("lag = %v, want the runner's 5 (the table's 0 is not this process's to report)", got)
		}
	}
}

// TestMonitorPartialFailures: a dead-letter topic that does not exist
// fails the collections but not what they read (the consumer's lag is
// there); a schema without idemkit's tables fails every collection, so
// that IdemkitMonitorDown sees it, instead of looking healthy and empty.
func TestMonitorPartialFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	ctx := context.Background()
	e.produce(msg("a", "k"), msg("b", "k"))
	if err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
		return e.store.SavePositionTx(ctx, tx, e.group, e.topic, 0, 0, time.Time{}, 0)
	}); err != nil {
		t.Fatal(err)
	}
	e.runMonitor(idemotel.MonitorConfig{DeadLetterTopics: []string{testenv.Name(t, "missing_dlq")}})
	part := lbl("consumer", e.group, "partition", "0", "topic", e.topic)
	e.eventually("idemkit.consumer.lag", "lag 2 despite the missing dead-letter topic", func(m map[string]float64) bool { return m[part] == 2 })
	e.eventually("idemkit.monitor.collections", "failed collections", func(m map[string]float64) bool {
		return m[lbl("outcome", "failed")] >= 1 && m[lbl("outcome", "ok")] == 0
	})

	wrong := newEnv(t, 1)
	m, err := wrong.tel.Monitor(wrong.db.Pool, &idemotel.MonitorConfig{Config: monitor.Config{Kafka: testenv.Kafka(t),
		Tables: migrate.Tables{Schema: wrong.db.Schema + "_typo"}}, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- m.Run(mctx) }()
	defer func() { cancel(); <-done }()
	wrong.eventually("idemkit.monitor.collections", "only failed collections", func(m map[string]float64) bool {
		return m[lbl("outcome", "failed")] >= 2 && m[lbl("outcome", "ok")] == 0
	})
	if got := points(t, wrong.collect(), "idemkit.monitor.snapshot_age"); len(got) != 0 {
		t.Fatalf("snapshot age with a wrong schema = %v, want none (no complete collection)", got)
	}
}
