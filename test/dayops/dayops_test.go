// Package dayops holds the consumer's day-2 operations tests that need a
// private broker or Kafka's own tools: a broker that is down when the runner
// starts, a broker killed and restarted under a running consumer, and
// records deleted (as by retention) before they were processed.
package dayops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/test/internal/containers"
	"github.com/idemkit/idemkit/test/internal/kafkaproc"
)

func TestMain(m *testing.M) { testenv.Main(m, containers.Start) }

// fixture is a schema with an effects table and a consumer config.
type fixture struct {
	t       *testing.T
	db      *testenv.DB
	store   *dedup.Store
	effects string
	log     *testenv.Logs
	logger  *slog.Logger
	applied atomic.Int64
}

func newFixture(t *testing.T) *fixture {
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		if err := testenv.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "effects"}.Sanitize()+` (
			id text PRIMARY KEY, runs int NOT NULL)`)
		return err
	})
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	logs, logger := testenv.NewLogs(t)
	return &fixture{t: t, db: db, store: store, effects: db.Table("effects"), log: logs, logger: logger}
}

func (f *fixture) config(brokers []string, topic, group string) *consumer.Config {
	return &consumer.Config{
		Kafka: kafkaconn.Config{Brokers: brokers}, Topic: topic, GroupID: group, Store: f.store,
		Logger: f.logger,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+f.effects+` (id, runs) VALUES ($1, 1)
				ON CONFLICT (id) DO UPDATE SET runs = `+f.effects+`.runs + 1`, m.ID)
			return err
		}),
		Observers: []consumer.Observer{&testobs.Hooks{OnOutcome: func(_ context.Context, _ *consumer.Message, o consumer.Outcome) {
			if o == consumer.Applied {
				f.applied.Add(1)
			}
		}}},
	}
}

// runs returns runs per message ID.
func (f *fixture) runs() map[string]int {
	rows, err := f.db.Pool.Query(context.Background(), `SELECT id, runs FROM `+f.effects)
	if err != nil {
		f.t.Fatal(err)
	}
	out := map[string]int{}
	var id string
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil }); err != nil {
		f.t.Fatal(err)
	}
	return out
}

// running is a runner in the background.
type running struct {
	cancel context.CancelFunc
	errc   chan error
	once   sync.Once
	err    error
	done   bool
}

func start(t *testing.T, pool *pgxpool.Pool, cfg *consumer.Config) *running {
	r, err := consumer.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rr := &running{cancel: cancel, errc: make(chan error, 1)}
	go func() { rr.errc <- r.Run(ctx) }()
	t.Cleanup(func() { rr.stop(t) })
	return rr
}

func (r *running) stop(t *testing.T) {
	r.cancel()
	r.once.Do(func() { r.err = <-r.errc })
	if r.err != nil && !r.done {
		r.done = true
		t.Errorf("Run: %v", r.err)
	}
}

// alive fails the test if Run returned.
func (r *running) alive(t *testing.T, what string) {
	select {
	case err := <-r.errc:
		r.once.Do(func() { r.err = err })
		r.done = true
		t.Fatalf("Run returned %s: %v", what, err)
	default:
	}
}

// waitFor polls cond until it holds, failing the test after d or if the
// runner returns.
func waitFor(t *testing.T, r *running, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); {
		r.alive(t, "while waiting for "+what)
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func createTopic(t *testing.T, addr, topic string, partitions int) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 30 * time.Second}
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatalf("create topic: %v", err)
	}
	if err := testenv.WaitTopic(ctx, client, topic, partitions); err != nil {
		t.Fatal(err)
	}
}

func produce(t *testing.T, addr, topic string, from, to int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, MaxAttempts: 20}
	defer w.Close()
	var msgs []kafka.Message
	for i := from; i < to; i++ {
		msgs = append(msgs, kafka.Message{Key: []byte("k" + strconv.Itoa(i%5)), Value: []byte("v"),
			Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte("m" + strconv.Itoa(i))}}})
	}
	for {
		err := w.WriteMessages(ctx, msgs...)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("produce: %v", err)
		}
		time.Sleep(200 * time.Millisecond) // a broker that just restarted
	}
}

// TestBrokerDownAtStart: a runner started while its broker is down waits for
// it, logging the outage once, and consumes once it is back.
func TestBrokerDownAtStart(t *testing.T) {
	t.Parallel()
	broker := kafkaproc.Start(t)
	topic, group := testenv.Name(t, "idemkit"), testenv.Name(t, "g")
	createTopic(t, broker.Addr, topic, 2)
	if err := broker.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	var started, ended atomic.Int32
	cfg := f.config([]string{broker.Addr}, topic, group)
	testobs.Of(cfg).OnOutageStarted = func(string, error) { started.Add(1) }
	testobs.Of(cfg).OnOutageEnded = func(string, time.Duration) { ended.Add(1) }
	r := start(t, f.db.Pool, cfg)
	waitFor(t, r, 30*time.Second, "the outage to be reported", func() bool { return started.Load() > 0 })
	time.Sleep(3 * time.Second) // several tries while the broker is down
	r.alive(t, "while its broker was down")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := broker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	produce(t, broker.Addr, topic, 0, 50)
	waitFor(t, r, 2*time.Minute, "50 messages", func() bool { return len(f.runs()) == 50 })
	if n := f.log.Count(outage.StartMsg, "kafka metadata"); n != 1 {
		t.Fatalf("the outage at start was logged %d times, want once", n)
	}
	if n := f.log.Count(outage.EndMsg, "kafka metadata"); n != 1 {
		t.Fatalf("the end of the outage was logged %d times, want once", n)
	}
	for id, n := range f.runs() {
		if n != 1 {
			t.Fatalf("%s applied %d times", id, n)
		}
	}
}

// TestBrokerKilledUnderConsumer: the broker is SIGKILLed and restarted twice
// while a runner consumes; Run never returns and every message is applied
// once.
func TestBrokerKilledUnderConsumer(t *testing.T) {
	t.Parallel()
	broker := kafkaproc.Start(t)
	topic, group := testenv.Name(t, "idemkit"), testenv.Name(t, "g")
	createTopic(t, broker.Addr, topic, 3)
	f := newFixture(t)
	cfg := f.config([]string{broker.Addr}, topic, group)
	cfg.SessionTimeout = 6 * time.Second
	r := start(t, f.db.Pool, cfg)
	produce(t, broker.Addr, topic, 0, 200)
	waitFor(t, r, time.Minute, "the first messages", func() bool { return f.applied.Load() > 0 })

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for round := range 2 {
		if err := broker.Stop(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		r.alive(t, fmt.Sprintf("while the broker was down (round %d)", round))
		if err := broker.Start(ctx); err != nil {
			t.Fatalf("restart the broker: %v\n%s", err, broker.LogTail())
		}
		produce(t, broker.Addr, topic, 200+round*100, 300+round*100)
	}
	waitFor(t, r, 2*time.Minute, "all 400 messages", func() bool { return len(f.runs()) == 400 })
	for id, n := range f.runs() {
		if n != 1 {
			t.Fatalf("%s applied %d times", id, n)
		}
	}
	r.alive(t, "after the broker restarts")
}

// TestMessagesDeletedBeforeProcessing: records deleted from a partition (as
// by retention) before the consumer processed them are reported as lost, with
// their range, and the consumer continues at the log start.
func TestMessagesDeletedBeforeProcessing(t *testing.T) {
	t.Parallel()
	libs, err := kafkaproc.Libs()
	if err != nil {
		t.Fatal(err)
	}
	java, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("java is needed to run Kafka's admin client (scripts/dev installs it): %v", err)
	}
	broker := kafkaproc.Start(t)
	topic, group := testenv.Name(t, "idemkit"), testenv.Name(t, "g")
	createTopic(t, broker.Addr, topic, 1)
	f := newFixture(t)

	// The consumer processed 3 messages, then stopped.
	produce(t, broker.Addr, topic, 0, 3)
	r := start(t, f.db.Pool, f.config([]string{broker.Addr}, topic, group))
	waitFor(t, r, time.Minute, "3 messages", func() bool { return len(f.runs()) == 3 })
	r.stop(t)

	// While it was stopped, 7 more came and the first 8 were deleted.
	produce(t, broker.Addr, topic, 3, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, java, "-cp", filepath.Join(libs, "*"),
		filepath.Join("testdata", "DeleteRecords.java"), broker.Addr, topic, "0", "8").CombinedOutput()
	if err != nil {
		t.Fatalf("delete records: %v\n%s", err, out)
	}
	if !strings.HasSuffix(strings.TrimSpace(string(out)), "8") {
		t.Fatalf("delete records: log start is not 8:\n%s", out)
	}

	var moved atomic.Pointer[consumer.PositionError]
	cfg := f.config([]string{broker.Addr}, topic, group)
	testobs.Of(cfg).OnPositionMoved = func(err *consumer.PositionError) { moved.Store(err) }
	r = start(t, f.db.Pool, cfg)
	waitFor(t, r, time.Minute, "the 2 messages left", func() bool { return len(f.runs()) == 5 })
	m := moved.Load()
	if m == nil || !errors.Is(m, consumer.ErrMessagesLost) || m.Position != 3 || m.LogStart != 8 {
		t.Fatalf("PositionMoved = %+v, want ErrMessagesLost for [3, 8)", m)
	}
	if n := f.log.Count("messages were deleted by Kafka before this consumer processed them; continuing at the log start", ""); n != 1 {
		t.Fatalf("the lost range was logged %d times, want once", n)
	}
	runs := f.runs()
	for _, id := range []string{"m0", "m1", "m2", "m8", "m9"} {
		if runs[id] != 1 {
			t.Fatalf("effects %v: want %s applied once", runs, id)
		}
	}
}
