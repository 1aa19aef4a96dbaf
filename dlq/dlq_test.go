package dlq_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

type env struct {
	t       *testing.T
	topic   string
	dlq     string
	group   string
	db      *testenv.DB
	store   *dedup.Store
	effects string
	logger  *slog.Logger
}

func newEnv(t *testing.T, createDLQ bool) *env {
	t.Helper()
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
	e := &env{t: t, topic: testenv.NewTopic(t, 1), group: testenv.Name(t, "g"), db: db, store: store,
		effects: db.Table("effects"), logger: slog.New(slog.NewTextHandler(t.Output(), nil))}
	e.dlq = e.topic + dlq.TopicSuffixDefault
	if createDLQ {
		testenv.CreateTopic(t, e.dlq, 1)
	}
	return e
}

func (e *env) produce(ids ...string) {
	e.t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(e.t)...), Topic: e.topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond}
	defer w.Close()
	var msgs []kafka.Message
	for _, id := range ids {
		msgs = append(msgs, kafka.Message{Key: []byte("k"), Value: []byte("v-" + id),
			Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}, {Key: "trace", Value: []byte("t-" + id)}}})
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) effect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+e.effects+` (id, runs) VALUES ($1, 1)
		ON CONFLICT (id) DO UPDATE SET runs = `+e.effects+`.runs + 1`, m.ID)
	return err
}

func (e *env) runs() map[string]int {
	e.t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `SELECT id, runs FROM `+e.effects)
	if err != nil {
		e.t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			e.t.Fatal(err)
		}
		out[id] = n
	}
	return out
}

// deadLetters reads the dead-letter topic.
func (e *env) deadLetters() []*dlq.DeadLetter {
	e.t.Helper()
	var out []*dlq.DeadLetter
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := dlq.Scan(ctx, testenv.Kafka(e.t), e.dlq, func(m kafka.Message) error {
		d, err := dlq.Parse(m)
		if err != nil {
			return err
		}
		out = append(out, d)
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// consume runs a consumer with a dead-letter writer until n messages have an
// outcome; fail decides which IDs fail and how.
func (e *env) consume(n int, fail func(m *consumer.Message, attempt int) error) {
	e.t.Helper()
	e.consumeWith(n, fail, nil)
}

// consumeWith is consume with the consumer's config changed by mutate.
func (e *env) consumeWith(n int, fail func(m *consumer.Message, attempt int) error, mutate func(*consumer.Config)) {
	e.t.Helper()
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(e.t), Group: e.group, Logger: e.logger,
		Retry: retry.Policy{InitialInterval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond, MaxAttempts: -1, MaxElapsedTime: -1}})
	if err != nil {
		e.t.Fatal(err)
	}
	defer w.Close()
	var mu sync.Mutex
	attempts := map[string]int{}
	done := make(chan struct{})
	var outcomes atomic.Int32
	cfg := &consumer.Config{
		Kafka: testenv.Kafka(e.t), Topic: e.topic, GroupID: e.group, Store: e.store,
		Logger: e.logger, OnFailure: w.OnFailure,
		Retry: retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 20 * time.Millisecond, MaxAttempts: 3},
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			mu.Lock()
			attempts[m.ID]++
			a := attempts[m.ID]
			mu.Unlock()
			if err := fail(m, a); err != nil {
				return err
			}
			return e.effect(ctx, tx, m)
		}),
		Observers: []consumer.Observer{&testobs.Hooks{OnOutcome: func(context.Context, *consumer.Message, consumer.Outcome) {
			if int(outcomes.Add(1)) == n {
				close(done)
			}
		}}},
	}
	if mutate != nil {
		mutate(cfg)
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		e.t.Error("timed out waiting for outcomes")
	}
	cancel()
	if err := <-errc; err != nil {
		e.t.Fatalf("Run: %v", err)
	}
}

func header(d *dlq.DeadLetter, key string) string {
	for _, h := range d.Message.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// TestPermanentErrorGoesStraightToDLQ: a permanent error is not retried; the
// dead letter carries the original message and every documented header.
func TestPermanentErrorGoesStraightToDLQ(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.produce("a", "bad", "b", "flaky")
	calls := map[string]int{}
	var mu sync.Mutex
	before := time.Now()
	e.consume(4, func(m *consumer.Message, attempt int) error {
		mu.Lock()
		calls[m.ID] = attempt
		mu.Unlock()
		switch m.ID {
		case "bad":
			return retry.Permanent(errors.New("card declined"))
		case "flaky":
			return errors.New("provider timeout") // transient: retried, then dead-lettered
		}
		return nil
	})
	if calls["bad"] != 1 {
		t.Fatalf("permanent failure ran %d times, want 1", calls["bad"])
	}
	if calls["flaky"] != 3 {
		t.Fatalf("transient failure ran %d times, want 3 (MaxAttempts)", calls["flaky"])
	}
	if runs := e.runs(); len(runs) != 2 || runs["a"] != 1 || runs["b"] != 1 {
		t.Fatalf("effects %v, want a and b once", runs)
	}
	dls := e.deadLetters()
	if len(dls) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dls))
	}
	bad, flaky := dls[0], dls[1]
	if bad.MessageID != "bad" || flaky.MessageID != "flaky" {
		t.Fatalf("dead letters %s, %s", bad.MessageID, flaky.MessageID)
	}
	want := map[string]string{
		dlq.HeaderOriginTopic: e.topic, dlq.HeaderOriginPartition: "0", dlq.HeaderOriginOffset: "1",
		dlq.HeaderGroup: e.group, dlq.HeaderConsumer: e.group, dlq.HeaderMessageID: "bad",
		dlq.HeaderError: "card declined", dlq.HeaderErrorClass: "permanent", dlq.HeaderAttempts: "1",
		dlq.HeaderReplayRound: "0", consumer.IDHeaderDefault: "bad", "trace": "t-bad",
	}
	for k, v := range want {
		if got := header(bad, k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if string(bad.Message.Key) != "k" || string(bad.Message.Value) != "v-bad" {
		t.Errorf("original key/value not kept: %q %q", bad.Message.Key, bad.Message.Value)
	}
	first, err1 := time.Parse(time.RFC3339Nano, header(bad, dlq.HeaderFirstFailure))
	last, err2 := time.Parse(time.RFC3339Nano, header(bad, dlq.HeaderLastFailure))
	if err1 != nil || err2 != nil || first.Before(before) || last.Before(first) {
		t.Errorf("failure times %v (%v) .. %v (%v)", first, err1, last, err2)
	}
	if header(flaky, dlq.HeaderErrorClass) != "transient" || header(flaky, dlq.HeaderAttempts) != "3" ||
		len(flaky.History) != 1 || flaky.History[0].Attempts != 3 {
		t.Errorf("flaky: class %q attempts %q history %+v", header(flaky, dlq.HeaderErrorClass),
			header(flaky, dlq.HeaderAttempts), flaky.History)
	}
}

// TestDLQUnavailableMakesThePartitionWait: while the dead-letter topic does
// not exist, the failing message is neither dropped nor passed: the
// partition waits; once the topic exists, it is dead-lettered and the rest
// flows.
func TestDLQUnavailableMakesThePartitionWait(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false)
	e.produce("bad", "after")
	go func() {
		// Give the consumer time to fail, try the missing topic and wait.
		time.Sleep(2 * time.Second)
		if runs := e.runs(); len(runs) != 0 {
			t.Errorf("while the DLQ is missing, effects %v: want none (the partition must wait)", runs)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := kafkaconn.CreateTopic(ctx, testenv.Kafka(t), e.dlq, 1, 1); err != nil {
			t.Error(err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = testenv.Client(t).DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{e.dlq}})
	})
	e.consume(2, func(m *consumer.Message, _ int) error {
		if m.ID == "bad" {
			return retry.Permanent(errors.New("invalid"))
		}
		return nil
	})
	if runs := e.runs(); runs["after"] != 1 || len(runs) != 1 {
		t.Fatalf("effects %v, want only after", runs)
	}
	if dls := e.deadLetters(); len(dls) != 1 || dls[0].MessageID != "bad" {
		t.Fatalf("dead letters %v, want bad", dls)
	}
}

func (e *env) reprocessor(mode dlq.Mode, h consumer.HandlerFunc, mutate func(*dlq.ReprocessorConfig)) *dlq.Reprocessor {
	e.t.Helper()
	return e.reprocessorOn(e.db.Pool, mode, h, mutate)
}

// reprocessorOn is reprocessor with its records reached through pool.
func (e *env) reprocessorOn(pool *pgxpool.Pool, mode dlq.Mode, h consumer.HandlerFunc, mutate func(*dlq.ReprocessorConfig)) *dlq.Reprocessor {
	e.t.Helper()
	cfg := &dlq.ReprocessorConfig{Kafka: testenv.Kafka(e.t), Topic: e.dlq, Mode: mode,
		Tables: migrate.Tables{Schema: e.db.Schema}, Logger: e.logger, ReplayedBy: "test",
		Retry: retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, MaxAttempts: 2}}
	if h != nil {
		cfg.Handler = h
	}
	if mutate != nil {
		mutate(cfg)
	}
	r, err := dlq.NewReprocessor(pool, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = r.Close() })
	return r
}

// TestReplay: replaying dead letters whose effects already happened repeats
// nothing; after the handler is fixed each effect happens exactly once; a
// replay interrupted in the middle and run again still applies each once; a
// second replay of the same topic is a no-op; a dry run changes nothing.
func TestReplay(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	ids := []string{"d0", "d1", "d2", "d3", "d4", "d5"}
	e.produce(ids...)
	e.consume(len(ids), func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })
	if n := len(e.deadLetters()); n != len(ids) {
		t.Fatalf("%d dead letters, want %d", n, len(ids))
	}
	// d0's effect happened meanwhile through the normal path (say, the
	// producer re-sent it after the fix and the consumer applied it).
	tx, err := e.db.Pool.Begin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.ClaimTx(context.Background(), tx, dedup.Claim{Consumer: e.group, MessageID: "d0", Topic: e.topic}); err != nil {
		t.Fatal(err)
	}
	if err := e.effect(context.Background(), tx, &consumer.Message{ID: "d0"}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Dry run: reports, changes nothing.
	sum, err := e.reprocessor(dlq.Redrive, e.effect, func(c *dlq.ReprocessorConfig) { c.DryRun = true }).Run(context.Background())
	if err != nil || sum.Records[dlq.WouldReplay] != 5 || sum.Records[dlq.AlreadyApplied] != 1 {
		t.Fatalf("dry run: %v %v", sum, err)
	}
	if runs := e.runs(); len(runs) != 1 {
		t.Fatalf("dry run changed effects: %v", runs)
	}

	// A replay that crashes after two effects: its context ends mid-run.
	ctx, cancel := context.WithCancel(context.Background())
	var applied atomic.Int32
	_, err = e.reprocessor(dlq.Redrive, func(c context.Context, tx pgx.Tx, m *consumer.Message) error {
		if applied.Add(1) == 3 {
			cancel()
			return c.Err()
		}
		return e.effect(c, tx, m)
	}, nil).Run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted replay returned %v", err)
	}

	// Rerun: finishes the rest, each effect once.
	var items []dlq.Item
	sum, err = e.reprocessor(dlq.Redrive, e.effect, func(c *dlq.ReprocessorConfig) {
		c.Progress = func(it dlq.Item) { items = append(items, it) }
	}).Run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sum.Records[dlq.AlreadyReplayed] != 3 || sum.Records[dlq.Applied] != 3 || len(items) != 6 {
		t.Fatalf("rerun: %v (%d items)", sum, len(items))
	}
	runs := e.runs()
	for _, id := range ids {
		if runs[id] != 1 {
			t.Fatalf("%s ran %d times, want 1 (effects %v)", id, runs[id], runs)
		}
	}

	// Replaying the same topic again is a no-op.
	sum, err = e.reprocessor(dlq.Redrive, e.effect, nil).Run(context.Background())
	if err != nil || sum.Records[dlq.AlreadyReplayed] != len(ids) {
		t.Fatalf("second replay: %v %v", sum, err)
	}
	var lineage int
	if err := e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.db.Table(migrate.DLQReplaysDefault)+
		` WHERE replayed_by = 'test' AND replayed_at > now() - interval '5 minutes'`).Scan(&lineage); err != nil || lineage != len(ids) {
		t.Fatalf("replay records: %d (%v), want %d", lineage, err, len(ids))
	}
}

// TestReplayFailsAgainThenExhausts: a dead letter that fails again goes back to
// the dead-letter topic with its history extended; when it fails in its last
// replay round it is exhausted instead of looping. Filters select what is
// replayed.
func TestReplayFailsAgainThenExhausts(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.produce("x", "y")
	e.consume(2, func(*consumer.Message, int) error { return retry.Permanent(errors.New("schema v1")) })

	broken := func(context.Context, pgx.Tx, *consumer.Message) error { return errors.New("still broken") }
	only := func(c *dlq.ReprocessorConfig) { c.Filter = dlq.Filter{MessageIDs: []string{"x"}}; c.ReplayLimit = 2 }
	sum, err := e.reprocessor(dlq.Redrive, broken, only).Run(context.Background())
	if err != nil || sum.Records[dlq.FailedAgain] != 1 || sum.Records[dlq.Skipped] != 1 {
		t.Fatalf("round 1: %v %v", sum, err)
	}
	dls := e.deadLetters()
	if len(dls) != 3 {
		t.Fatalf("%d dead letters after a failed replay, want 3", len(dls))
	}
	again := dls[2]
	if again.MessageID != "x" || again.Round != 1 || len(again.History) != 2 ||
		again.History[0].Error != "schema v1" || again.History[1].Error != "still broken" {
		t.Fatalf("re-failed dead letter: round %d history %+v", again.Round, again.History)
	}

	// Round 2 is the last of 2: its failure parks it, not written back.
	sum, err = e.reprocessor(dlq.Redrive, broken, only).Run(context.Background())
	if err != nil || sum.Records[dlq.Exhausted] != 1 || sum.Records[dlq.AlreadyReplayed] != 1 {
		t.Fatalf("round 2: %v %v", sum, err)
	}
	if n := len(e.deadLetters()); n != 3 {
		t.Fatalf("%d dead letters, want 3 (exhausted, not looped)", n)
	}
	if runs := e.runs(); len(runs) != 0 {
		t.Fatalf("effects %v, want none", runs)
	}
}

// TestRepublish: Republish sends dead letters back to their origin topic with
// their message ID, skips those already applied, and the consumer applies
// each once.
func TestRepublish(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.produce("r0", "r1")
	fixed := atomic.Bool{}
	e.consume(2, func(m *consumer.Message, _ int) error {
		if !fixed.Load() {
			return retry.Permanent(errors.New("bug"))
		}
		return nil
	})
	sum, err := e.reprocessor(dlq.Republish, nil, nil).Run(context.Background())
	if err != nil || sum.Records[dlq.Republished] != 2 {
		t.Fatalf("republish: %v %v", sum, err)
	}
	sum, err = e.reprocessor(dlq.Republish, nil, nil).Run(context.Background())
	if err != nil || sum.Records[dlq.AlreadyReplayed] != 2 {
		t.Fatalf("republish again: %v %v", sum, err)
	}
	fixed.Store(true)
	e.consume(2, func(*consumer.Message, int) error { return nil })
	if runs := e.runs(); runs["r0"] != 1 || runs["r1"] != 1 || len(runs) != 2 {
		t.Fatalf("effects %v, want r0 and r1 once", runs)
	}
}

func TestNewReprocessorRejectsBadConfig(t *testing.T) {
	t.Parallel()
	pool := &pgxpool.Pool{}
	for i, cfg := range []*dlq.ReprocessorConfig{
		nil,
		{Topic: "t.dlq", Mode: dlq.Republish},
		{Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Mode: dlq.Republish},
		{Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t.dlq"},
		{Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t.dlq", Mode: dlq.Redrive},
		{Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t.dlq", Mode: dlq.Republish, Rate: -1},
	} {
		if _, err := dlq.NewReprocessor(pool, cfg); !errors.Is(err, dlq.ErrInvalidConfig) {
			t.Errorf("config %d: %v, want ErrInvalidConfig", i, err)
		}
	}
	valid := &dlq.ReprocessorConfig{Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t.dlq", Mode: dlq.Republish}
	if _, err := dlq.NewReprocessor(nil, valid); !errors.Is(err, dlq.ErrInvalidConfig) {
		t.Errorf("nil pool: %v, want ErrInvalidConfig", err)
	}
	if _, err := dlq.NewWriter(&dlq.WriterConfig{}); !errors.Is(err, dlq.ErrInvalidConfig) {
		t.Errorf("writer without brokers: %v", err)
	}
	// Letters written without a consumer name could never be replayed.
	if _, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: kafkaconn.Config{Brokers: []string{"b"}}}); !errors.Is(err, dlq.ErrInvalidConfig) {
		t.Errorf("writer without Group or Consumer: %v", err)
	}
}

// TestConfigValidate: the configs' Validate refuses what NewWriter and
// NewReprocessor refuse, before anything connects, and accepts a complete
// configuration.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	kc := kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}
	w := dlq.WriterConfig{Kafka: kc, Group: "g"}
	if err := w.Validate(); err != nil {
		t.Fatalf("WriterConfig.Validate of a complete config: %v", err)
	}
	for name, mutate := range map[string]func(*dlq.WriterConfig){
		"no brokers":      func(c *dlq.WriterConfig) { c.Kafka.Brokers = nil },
		"no name":         func(c *dlq.WriterConfig) { c.Group = "" },
		"negative outage": func(c *dlq.WriterConfig) { c.MaxOutage = -time.Second },
		"route, no match": func(c *dlq.WriterConfig) { c.Routes = []dlq.Route{{Topic: "t.dlq"}} },
		"bad retry":       func(c *dlq.WriterConfig) { c.Retry.Multiplier = 0.5 },
		"bad table": func(c *dlq.WriterConfig) {
			c.Pool = &pgxpool.Pool{}
			c.Tables.DLQValues = "values\x00"
		},
	} {
		c := w
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, dlq.ErrInvalidConfig) {
			t.Errorf("WriterConfig %s: Validate = %v, want ErrInvalidConfig", name, err)
		}
		if _, err := dlq.NewWriter(&c); !errors.Is(err, dlq.ErrInvalidConfig) {
			t.Errorf("WriterConfig %s: NewWriter = %v, want ErrInvalidConfig", name, err)
		}
	}

	r := dlq.ReprocessorConfig{Kafka: kc, Topic: "t.dlq", Mode: dlq.Republish}
	if err := r.Validate(); err != nil {
		t.Fatalf("ReprocessorConfig.Validate of a complete config: %v", err)
	}
	for name, mutate := range map[string]func(*dlq.ReprocessorConfig){
		"no brokers":          func(c *dlq.ReprocessorConfig) { c.Kafka.Brokers = nil },
		"no topic":            func(c *dlq.ReprocessorConfig) { c.Topic = "" },
		"redrive, no handler": func(c *dlq.ReprocessorConfig) { c.Mode = dlq.Redrive },
		"negative timeout":    func(c *dlq.ReprocessorConfig) { c.HandlerTimeout = -time.Second },
		"bad retry":           func(c *dlq.ReprocessorConfig) { c.Retry.Multiplier = 0.5 },
		"bad schema":          func(c *dlq.ReprocessorConfig) { c.Tables.Schema = "s\x00" },
		"same tables": func(c *dlq.ReprocessorConfig) {
			c.Tables.DLQReplays, c.Tables.DLQValues = "dlq", "dlq"
		},
	} {
		c := r
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, dlq.ErrInvalidConfig) {
			t.Errorf("ReprocessorConfig %s: Validate = %v, want ErrInvalidConfig", name, err)
		}
		if _, err := dlq.NewReprocessor(&pgxpool.Pool{}, &c); !errors.Is(err, dlq.ErrInvalidConfig) {
			t.Errorf("ReprocessorConfig %s: NewReprocessor = %v, want ErrInvalidConfig", name, err)
		}
	}
	var nilw *dlq.WriterConfig
	var nilr *dlq.ReprocessorConfig
	if !errors.Is(nilw.Validate(), dlq.ErrInvalidConfig) || !errors.Is(nilr.Validate(), dlq.ErrInvalidConfig) {
		t.Errorf("a nil config validates")
	}
}
