package monitor_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/monitor"
	"github.com/idemkit/idemkit/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

func newMonitor(t *testing.T, cfg monitor.Config) *monitor.Monitor {
	t.Helper()
	m, err := monitor.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

func produce(t *testing.T, topic string, partition, n int) {
	t.Helper()
	recs := make([]kafka.Record, n)
	for i := range recs {
		recs[i] = kafka.Record{Value: kafka.NewBytes([]byte(fmt.Sprint(i)))}
	}
	testenv.Produce(t, topic, partition, recs...)
}

// savePosition records consumer's position on topic's partition, as its
// runner would have.
func savePosition(t *testing.T, db *testenv.DB, consumer, topic string, partition int, next int64) {
	t.Helper()
	ctx := context.Background()
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return store.SavePositionTx(ctx, tx, consumer, topic, partition, next, time.Time{}, 0)
	}); err != nil {
		t.Fatal(err)
	}
}

// TestCollectWithNoProcessRunning: everything Collect reports comes from
// the tables and the topic, with no consumer or relay running: the lag of
// a partition with a position and of one without, the parked messages, the
// oldest processed record, the outbox backlog and its dead messages.
func TestCollectWithNoProcessRunning(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t, testenv.Migrate)
	topic := testenv.NewTopic(t, 2)
	produce(t, topic, 0, 30)
	produce(t, topic, 1, 10)

	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	// Consumer "billing" processed partition 0 up to offset 12 (exclusive).
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		if _, err := store.ClaimTx(ctx, tx, dedup.Claim{Consumer: "billing", MessageID: "m-11", Topic: topic, Partition: 0, Offset: 11}); err != nil {
			return err
		}
		return store.SavePositionTx(ctx, tx, "billing", topic, 0, 12, time.Time{}, 0)
	}); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	id := func(table string) string { return pgx.Identifier{db.Schema, table}.Sanitize() }
	exec(`UPDATE ` + id("processed_messages") + ` SET processed_at = now() - interval '2 hours'`)
	exec(`INSERT INTO `+id("idemkit_parked_messages")+` (consumer, topic, kafka_partition, kafka_offset, message_key, message_id, parked_at)
		VALUES ('billing', $1, 1, 3, 'k', 'm-3', now() - interval '90 minutes')`, topic)

	ob, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: topic, Key: []byte("a"), Value: []byte("1")},
			outbox.Message{Topic: topic, Key: []byte("b"), Value: []byte("2")},
			outbox.Message{Topic: topic, Key: []byte("b"), Value: []byte("3")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	exec(`UPDATE ` + id("idemkit_outbox") + ` SET created_at = now() - interval '10 minutes' WHERE msg_key = 'a'`)
	// Key b's first message failed for good, its second waits behind it.
	exec(`UPDATE ` + id("idemkit_outbox") + ` SET dead_at = now() WHERE msg_key = 'b' AND value = '2'`)
	exec(`UPDATE ` + id("idemkit_outbox") + ` SET dead_at = now(), blocked_by = (SELECT id FROM ` + id("idemkit_outbox") +
		` WHERE value = '2') WHERE value = '3'`)

	m := newMonitor(t, monitor.Config{Kafka: testenv.Kafka(t), Tables: migrate.Tables{Schema: db.Schema}})
	s, err := m.Collect(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Consumers) != 1 {
		t.Fatalf("consumers = %+v, want billing", s.Consumers)
	}
	c := s.Consumers[0]
	if c.Name != "billing" || c.Topic != topic || c.Lag != 18+10 || len(c.Partitions) != 2 {
		t.Fatalf("billing = %+v, want lag 28 (18 on partition 0, 10 on 1) over 2 partitions", c)
	}
	if p := c.Partitions[0]; p.Position != 12 || p.Lag == nil || *p.Lag != 18 || *p.StableEnd != 30 || p.Note != "" {
		t.Fatalf("partition 0 = %+v", p)
	}
	if p := c.Partitions[1]; p.Position != 0 || p.Lag == nil || *p.Lag != 10 || p.Note == "" {
		t.Fatalf("partition 1 (no position) = %+v, want lag 10 from the log start, with a note", p)
	}
	if c.Parked != 1 || c.OldestParkedAge == nil || *c.OldestParkedAge < 89*time.Minute || *c.OldestParkedAge > 91*time.Minute {
		t.Fatalf("parked = %d, oldest %v; want 1, about 90 minutes", c.Parked, c.OldestParkedAge)
	}
	if a := c.OldestRecordAge; a == nil || *a < 119*time.Minute || *a > 121*time.Minute {
		t.Fatalf("oldest record age = %v, want about 2 hours", a)
	}
	o := s.Outbox
	if o == nil || o.Backlog != 1 || o.Dead != 2 || o.Held != 1 || o.OldestAge < 9*time.Minute || o.OldestAge > 11*time.Minute {
		t.Fatalf("outbox = %+v, want backlog 1 about 10 minutes old, 2 dead of which 1 held", o)
	}
	if s.Idempotency == nil || s.Idempotency.Stuck != 0 {
		t.Fatalf("idempotency = %+v, want 0 stuck", s.Idempotency)
	}
	if s.DailyPartitionsAhead != nil || len(s.Missing) != 0 {
		t.Fatalf("daily partitions ahead %v, missing %v: want none with the flat layout, all tables there", s.DailyPartitionsAhead, s.Missing)
	}
}

// TestCollectNotMigrated: a schema without idemkit's tables is reported as
// such, without an error.
func TestCollectNotMigrated(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	m := newMonitor(t, monitor.Config{Kafka: testenv.Kafka(t), Tables: migrate.Tables{Schema: db.Schema}})
	s, err := m.Collect(context.Background(), db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"consumer_positions", "idemkit_outbox", "idempotency_records"} {
		if !slices.Contains(s.Missing, table) {
			t.Errorf("missing = %v, want %s in it", s.Missing, table)
		}
	}
	if len(s.Consumers) != 0 || s.Outbox != nil || s.Idempotency != nil {
		t.Fatalf("snapshot of an empty schema = %+v", s)
	}
}

// TestCollectKafkaDown: without Kafka the lag is unknown and Collect says
// why; what PostgreSQL holds is still there.
func TestCollectKafkaDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t, testenv.Migrate)
	savePosition(t, db, "billing", "orders", 0, 5)
	m := newMonitor(t, monitor.Config{Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:1"}, DialTimeout: time.Second}, Tables: migrate.Tables{Schema: db.Schema}})
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := m.Collect(qctx, db.Pool)
	var ne *net.OpError
	if !errors.As(err, &ne) || !strings.Contains(err.Error(), "orders") {
		t.Fatalf("Collect without Kafka: %v, want the dial error, naming the topic", err)
	}
	if len(s.Consumers) != 1 || s.Consumers[0].Partitions[0].Position != 5 || s.Consumers[0].Partitions[0].Lag != nil {
		t.Fatalf("snapshot = %+v, want billing's position 5 with the lag unknown", s.Consumers)
	}
	if s.Outbox == nil || s.Idempotency == nil {
		t.Fatalf("outbox %+v, idempotency %+v: want them read although Kafka is down", s.Outbox, s.Idempotency)
	}
}

// TestSlowOldestRecordKeepsTheConnection: a search for the oldest record
// that takes longer than OldestRecordTimeout (here: the table locked by
// another session) is given up on the server: the age is unknown, a note
// says why, the rest is read, and the Monitor's connection still works.
func TestSlowOldestRecordKeepsTheConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t, testenv.Migrate)
	savePosition(t, db, "billing", "orders", 0, 5)
	lock, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lock.Rollback(ctx) }()
	if _, err := lock.Exec(ctx, `LOCK TABLE `+db.Table("processed_messages")+` IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	m := newMonitor(t, monitor.Config{Kafka: testenv.Kafka(t), Tables: migrate.Tables{Schema: db.Schema},
		OldestRecordTimeout: 300 * time.Millisecond})
	s, err := m.Collect(ctx, conn)
	if err != nil {
		t.Fatalf("Collect with the records table locked: %v", err)
	}
	if len(s.Consumers) != 1 || s.Consumers[0].OldestRecordAge != nil || len(s.Notes) != 1 || !strings.Contains(s.Notes[0], "longer than") {
		t.Fatalf("consumers %+v, notes %q: want billing with its oldest record unknown, and a note", s.Consumers, s.Notes)
	}
	if s.Outbox == nil || conn.IsClosed() {
		t.Fatalf("outbox %+v, connection closed %v: want the rest read and the connection kept", s.Outbox, conn.IsClosed())
	}
	_ = lock.Rollback(ctx)
	if _, err := m.Collect(ctx, conn); err != nil {
		t.Fatalf("Collect again on the same connection: %v", err)
	}
}

// TestRecreatedTopicCountsAsWaiting: a position past the log end (the
// topic was deleted and created again) counts every message of the new
// topic as waiting, not none.
func TestRecreatedTopicCountsAsWaiting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t, testenv.Migrate)
	topic := testenv.NewTopic(t, 1)
	produce(t, topic, 0, 50)
	savePosition(t, db, "billing", topic, 0, 1000)
	m := newMonitor(t, monitor.Config{Kafka: testenv.Kafka(t), Tables: migrate.Tables{Schema: db.Schema}})
	s, err := m.Collect(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Consumers[0]; c.Lag != 50 || !strings.Contains(c.Partitions[0].Note, "recreated") {
		t.Fatalf("billing = %+v, want lag 50 (the whole new topic) and a note", c)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, cfg := range []*monitor.Config{nil, {}, {Kafka: kafkaconn.Config{Brokers: []string{"x:1"}}, OldestRecordTimeout: -1},
		{Kafka: kafkaconn.Config{Brokers: []string{"x:1"}}, Tables: migrate.Tables{Schema: "a\x00b"}}} {
		if _, err := monitor.New(cfg); !errors.Is(err, monitor.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestStuckCountedEveryInterval: the stuck records are counted at most
// once per StuckInterval; a Collect in between reports the last count.
func TestStuckCountedEveryInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t, testenv.Migrate)
	m := newMonitor(t, monitor.Config{Kafka: testenv.Kafka(t), Tables: migrate.Tables{Schema: db.Schema}, StuckInterval: 300 * time.Millisecond})
	stuck := func() int64 {
		t.Helper()
		s, err := m.Collect(ctx, db.Pool)
		if err != nil || s.Idempotency == nil {
			t.Fatalf("Collect: %+v, %v", s, err)
		}
		return s.Idempotency.Stuck
	}
	if n := stuck(); n != 0 {
		t.Fatalf("stuck before = %d, want 0", n)
	}
	counted := time.Now()
	now := time.Now()
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+db.Table("idempotency_records")+` (account, operation,
		idempotency_key, fingerprint, state, token, locked_until, created_at, updated_at, expires_at)
		VALUES ('acct-1', 'POST /payments', 'k-1', '\x00', 'PROCESSING', 7, $1, $2, $2, $3)`,
		now.Add(-time.Minute), now.Add(-2*time.Minute), now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n := stuck(); n != 0 && time.Since(counted) < 300*time.Millisecond {
		t.Fatalf("stuck within the interval = %d, want the last count, 0", n)
	}
	time.Sleep(time.Until(counted.Add(300 * time.Millisecond)))
	if n := stuck(); n != 1 {
		t.Fatalf("stuck after the interval = %d, want 1", n)
	}
}

// TestOldestRecordWithTheDailyLayout: with the daily layout, a consumer's
// oldest record is at least as old as the oldest daily partition, so that
// a partition maintenance that never drops anything shows as a purge
// behind.
func TestOldestRecordWithTheDailyLayout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t, testenv.Migrate)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.EnableDaily(ctx, db.Pool, dedup.DailyConfig{AheadDays: 1}); err != nil {
		t.Fatal(err)
	}
	testenv.BackdateDaily(t, db.Pool, db.Schema, 3)
	if _, err := store.MaintainPartitions(ctx, db.Pool); err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		return store.SavePositionTx(ctx, tx, "billing", "orders", 0, 0, time.Time{}, 0)
	}); err != nil {
		t.Fatal(err)
	}
	m := newMonitor(t, monitor.Config{Kafka: testenv.Kafka(t), Tables: migrate.Tables{Schema: db.Schema}})
	s, err := m.Collect(ctx, db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if a := s.Consumers[0].OldestRecordAge; a == nil || *a < 72*time.Hour || *a > 96*time.Hour {
		t.Fatalf("oldest record age = %v, want the oldest partition's, 3 days and some", a)
	}
	if s.DailyPartitionsAhead == nil || *s.DailyPartitionsAhead < 1 {
		t.Fatalf("daily partitions ahead = %v, want at least 1", s.DailyPartitionsAhead)
	}
}
