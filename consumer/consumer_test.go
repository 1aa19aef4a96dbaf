package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// env is one test's topic, schema and effect table.
type env struct {
	t       *testing.T
	topic   string
	group   string
	db      *testenv.DB
	store   *dedup.Store
	effects string // table counting how often each message's effect ran
}

func newEnv(t *testing.T, partitions int) *env {
	t.Helper()
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		if err := testenv.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "effects"}.Sanitize()+` (
			id text PRIMARY KEY, runs int NOT NULL, amount bigint NOT NULL, seq bigserial)`)
		return err
	})
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, topic: testenv.NewTopic(t, partitions), group: testenv.Name(t, "g"),
		db: db, store: store, effects: db.Table("effects")}
}

// msg is a test message: ID header, key, and an amount as the value.
func msg(id, key string, amount int) kafka.Message {
	m := kafka.Message{Key: []byte(key), Value: []byte(strconv.Itoa(amount))}
	if id != "" {
		m.Headers = []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}
	}
	return m
}

func (e *env) produce(msgs ...kafka.Message) {
	e.t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(e.t)...), Topic: e.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
}

// effect is the business write: it counts runs per message and sums amounts,
// so any duplicate effect shows.
func (e *env) effect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	amount, err := strconv.Atoi(string(m.Value))
	if err != nil {
		return fmt.Errorf("bad amount %q: %w", m.Value, err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO `+e.effects+` (id, runs, amount) VALUES ($1, 1, $2)
		ON CONFLICT (id) DO UPDATE SET runs = `+e.effects+`.runs + 1, amount = `+e.effects+`.amount + excluded.amount`,
		m.ID, amount)
	return err
}

func (e *env) batchEffect(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
	ids := make([]string, len(msgs))
	amounts := make([]int64, len(msgs))
	for i, m := range msgs {
		a, err := strconv.Atoi(string(m.Value))
		if err != nil {
			return fmt.Errorf("bad amount %q: %w", m.Value, err)
		}
		ids[i], amounts[i] = m.ID, int64(a)
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+e.effects+` (id, runs, amount)
		SELECT id, 1, amount FROM unnest($1::text[], $2::bigint[]) AS t(id, amount)
		ON CONFLICT (id) DO UPDATE SET runs = `+e.effects+`.runs + 1, amount = `+e.effects+`.amount + excluded.amount`,
		ids, amounts)
	return err
}

// effects returns runs per message ID.
func (e *env) runs() map[string]int {
	e.t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `SELECT id, runs FROM `+e.effects)
	if err != nil {
		e.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct {
		id   string
		runs int
	}, error) {
		var v struct {
			id   string
			runs int
		}
		return v, r.Scan(&v.id, &v.runs)
	})
	if err != nil {
		e.t.Fatal(err)
	}
	m := map[string]int{}
	for _, v := range out {
		m[v.id] = v.runs
	}
	return m
}

// mode is a way of running the consumer; every behaviour test runs in each.
type mode struct {
	name  string
	batch int
	set   bool // use the batch handler
}

var modes = []mode{
	{name: "per-message", batch: 1},
	{name: "batched", batch: 50},
	{name: "batch-handler", batch: 50, set: true},
	{name: "default"}, // nothing set: adaptive batches of what is already fetched
}

// baseModes are the two modes every consumer test runs in at least: one
// transaction per message (BatchSize 1) and what a user who configures
// nothing gets (adaptive batches of the messages already fetched). Tests
// about how messages share transactions run in all modes.
var baseModes = []mode{modes[0], modes[3]}

// outcomes counts what the Outcome hook reports and signals when a total is reached.
type outcomes struct {
	mu     sync.Mutex
	byKind map[consumer.Outcome]int
	ids    map[string][]consumer.Outcome
	want   int
	done   chan struct{}
}

func newOutcomes(want int) *outcomes {
	return &outcomes{byKind: map[consumer.Outcome]int{}, ids: map[string][]consumer.Outcome{}, want: want,
		done: make(chan struct{})}
}

func (o *outcomes) hook(_ context.Context, m *consumer.Message, oc consumer.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.byKind[oc]++
	o.ids[m.ID] = append(o.ids[m.ID], oc)
	if n := o.byKind[consumer.Applied] + o.byKind[consumer.Duplicate] + o.byKind[consumer.Failed]; n == o.want {
		close(o.done)
	}
}

func (o *outcomes) count(oc consumer.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.byKind[oc]
}

// config returns a runner config for the env in the given mode. check, when
// set, runs first for each message and may fail it; the effect follows.
func (e *env) config(md mode, check func(ctx context.Context, m *consumer.Message) error) *consumer.Config {
	cfg := &consumer.Config{
		Kafka: testenv.Kafka(e.t), Topic: e.topic, GroupID: e.group,
		Store: e.store, BatchSize: md.batch,
		Retry:  retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		Logger: slog.New(slog.NewTextHandler(e.t.Output(), nil)),
	}
	if check == nil {
		check = func(context.Context, *consumer.Message) error { return nil }
	}
	if md.set {
		cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			for _, m := range msgs {
				if err := check(ctx, m); err != nil {
					return err
				}
			}
			return e.batchEffect(ctx, tx, msgs)
		})
	} else {
		cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if err := check(ctx, m); err != nil {
				return err
			}
			return e.effect(ctx, tx, m)
		})
	}
	return cfg
}

// run starts the runner and returns a function that stops it and returns Run's error.
func run(t *testing.T, pool *pgxpool.Pool, cfg *consumer.Config) (stop func() error) {
	t.Helper()
	r, err := consumer.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return runRunner(t, r)
}

// runRunner is run for a runner already made.
func runRunner(t *testing.T, r *consumer.Runner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	var result error
	stop = func() error {
		once.Do(func() { cancel(); result = <-errc })
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(90 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestDuplicateIDOneEffect: the same message ID produced twice (a producer
// retry) has one effect; the second copy is acknowledged as a duplicate.
func TestDuplicateIDOneEffect(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 2)
			var msgs []kafka.Message
			for i := range 20 {
				msgs = append(msgs, msg(fmt.Sprintf("pay-%d", i), fmt.Sprintf("k%d", i%4), 100))
			}
			msgs = append(msgs, msg("pay-7", "k3", 100), msg("pay-12", "k0", 100)) // producer retries
			e.produce(msgs...)

			oc := newOutcomes(len(msgs))
			cfg := e.config(md, nil)
			testobs.Of(cfg).OnOutcome = oc.hook
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "all messages")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			runs := e.runs()
			if len(runs) != 20 {
				t.Fatalf("%d messages had an effect, want 20", len(runs))
			}
			for id, n := range runs {
				if n != 1 {
					t.Fatalf("%s ran %d times", id, n)
				}
			}
			if got := oc.count(consumer.Duplicate); got != 2 {
				t.Fatalf("duplicates acknowledged: %d, want 2", got)
			}
		})
	}
}

// TestHandlerErrorRollsBack: a failing handler leaves no marker and no
// effect; the message is retried and succeeds once the cause heals, and the
// messages around it are applied exactly once.
func TestHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			var msgs []kafka.Message
			for i := range 10 {
				msgs = append(msgs, msg(fmt.Sprintf("m-%d", i), "k", 1))
			}
			e.produce(msgs...)

			var failures atomic.Int32
			var sawMarker atomic.Bool
			oc := newOutcomes(len(msgs))
			cfg := e.config(md, func(ctx context.Context, m *consumer.Message) error {
				if m.ID == "m-4" && failures.Load() < 3 {
					failures.Add(1)
					// The claim of an earlier failed attempt must not have survived it.
					if ok, err := e.store.Processed(ctx, e.db.Pool, e.group, "m-4"); err != nil || ok {
						sawMarker.Store(true)
					}
					return errors.New("downstream unavailable")
				}
				return nil
			})
			testobs.Of(cfg).OnOutcome = oc.hook
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "all messages")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if failures.Load() != 3 {
				t.Fatalf("handler failed %d times, want 3", failures.Load())
			}
			if sawMarker.Load() {
				t.Fatal("a failed attempt left its dedup marker behind")
			}
			runs := e.runs()
			for i := range 10 {
				if id := fmt.Sprintf("m-%d", i); runs[id] != 1 {
					t.Fatalf("%s ran %d times, want 1", id, runs[id])
				}
			}
		})
	}
}

// TestMissingID: a message with no ID is never processed without dedup. By
// default it fails (here to OnFailure, which sees ErrMissingID) and the
// messages after it flow; with MissingIDUseCoordinates it is processed under
// the ID topic/partition/offset.
func TestMissingID(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("a", "k", 1), msg("", "k", 1), msg("b", "k", 1))

			oc := newOutcomes(3)
			var failed []error
			cfg := e.config(md, nil)
			testobs.Of(cfg).OnOutcome = oc.hook
			cfg.OnFailure = func(ctx context.Context, m *consumer.Message, err error) error {
				failed = append(failed, err)
				return nil
			}
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "all messages")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if len(failed) != 1 || !errors.Is(failed[0], consumer.ErrMissingID) {
				t.Fatalf("OnFailure got %v, want one ErrMissingID", failed)
			}
			var merr *consumer.MessageError
			if !errors.As(failed[0], &merr) || merr.Offset != 1 || merr.Attempts != 1 {
				t.Fatalf("OnFailure error %#v: want offset 1 after 1 attempt", merr)
			}
			if runs := e.runs(); len(runs) != 2 || runs["a"] != 1 || runs["b"] != 1 {
				t.Fatalf("effects %v, want a and b once", runs)
			}
		})
	}

	t.Run("stops without OnFailure", func(t *testing.T) {
		t.Parallel()
		for _, md := range baseModes {
			t.Run(md.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, 1)
				e.produce(msg("a", "k", 1), msg("", "k", 1), msg("b", "k", 1))
				r, err := consumer.New(e.db.Pool, e.config(md, nil))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				err = r.Run(ctx)
				var merr *consumer.MessageError
				if !errors.As(err, &merr) || !errors.Is(err, consumer.ErrMissingID) || merr.Offset != 1 {
					t.Fatalf("Run returned %v, want a MessageError for offset 1 wrapping ErrMissingID", err)
				}
				if runs := e.runs(); len(runs) != 1 || runs["a"] != 1 {
					t.Fatalf("effects %v, want only a (b must wait behind the failure)", runs)
				}
				pos, err := e.store.Positions(context.Background(), e.db.Pool, e.group, e.topic)
				if err != nil || pos[0] != 1 {
					t.Fatalf("position %v (%v): want 1, the failed message not skipped", pos, err)
				}
			})
		}
	})

	t.Run("coordinates", func(t *testing.T) {
		t.Parallel()
		for _, md := range baseModes {
			t.Run(md.name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, 1)
				e.produce(msg("a", "k", 1), msg("", "k", 1))
				oc := newOutcomes(2)
				cfg := e.config(md, nil)
				cfg.MissingID = consumer.MissingIDUseCoordinates
				testobs.Of(cfg).OnOutcome = oc.hook
				stop := run(t, e.db.Pool, cfg)
				wait(t, oc.done, "both messages")
				if err := stop(); err != nil {
					t.Fatalf("Run: %v", err)
				}
				want := e.topic + "/0/1"
				if runs := e.runs(); runs["a"] != 1 || runs[want] != 1 {
					t.Fatalf("effects %v, want a and %s once", runs, want)
				}
			})
		}
	})
}

// TestPanicIsAnError: a poison value that makes the handler panic does not
// kill the runner: the panic becomes an error with its stack, goes through
// retries and OnFailure, and the other messages are applied.
func TestPanicIsAnError(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("a", "k", 1), msg("poison", "k", 1), msg("b", "k", 1), msg("flaky", "k", 1), msg("c", "k", 1))
			var flaky atomic.Int32
			var failed []error
			oc := newOutcomes(5)
			cfg := e.config(md, func(ctx context.Context, m *consumer.Message) error {
				switch {
				case m.ID == "poison":
					panic("poison value")
				case m.ID == "flaky" && flaky.Add(1) == 1:
					panic("flaky once")
				}
				return nil
			})
			testobs.Of(cfg).OnOutcome = oc.hook
			cfg.OnFailure = func(ctx context.Context, m *consumer.Message, err error) error {
				failed = append(failed, err)
				return nil
			}
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "all messages")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			var perr *idemkit.PanicError
			if len(failed) != 1 || !errors.As(failed[0], &perr) || perr.Value != "poison value" || len(perr.Stack) == 0 {
				t.Fatalf("OnFailure got %v, want one PanicError with a stack", failed)
			}
			runs := e.runs()
			if len(runs) != 4 || runs["a"] != 1 || runs["b"] != 1 || runs["c"] != 1 || runs["flaky"] != 1 {
				t.Fatalf("effects %v, want a, b, c and flaky once", runs)
			}
		})
	}
}

// TestPositionLivesWithEffects: the runner starts each partition from the
// position recorded in PostgreSQL when it is ahead of Kafka's committed
// offset, so a crash between the database commit and the offset commit costs
// no redelivery at all. Here the second run uses a new consumer group (no
// committed offset at all) with the same dedup name.
func TestPositionLivesWithEffects(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			for i := range 3 {
				e.produce(msg(fmt.Sprintf("m-%d", i), "k", 1))
			}
			oc := newOutcomes(3)
			cfg := e.config(md, nil)
			testobs.Of(cfg).OnOutcome = oc.hook
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "m-0..m-2")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}

			for i := 3; i < 6; i++ {
				e.produce(msg(fmt.Sprintf("m-%d", i), "k", 1))
			}
			oc = newOutcomes(3)
			cfg = e.config(md, nil)
			cfg.Name = cfg.GroupID
			cfg.GroupID = testenv.Name(t, "other")
			starts := make(chan int64, 1)
			testobs.Of(cfg).OnAssigned = func(_ string, _ int, start int64) {
				select { // the first assignment is the one that counts; never block the runner
				case starts <- start:
				default:
				}
			}
			testobs.Of(cfg).OnOutcome = oc.hook
			stop = run(t, e.db.Pool, cfg)
			wait(t, oc.done, "m-3..m-5")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if start := <-starts; start != 3 {
				t.Fatalf("second run started at %d, want 3 (the Postgres position)", start)
			}
			if d := oc.count(consumer.Duplicate); d != 0 {
				t.Fatalf("%d duplicates redelivered, want none", d)
			}
			runs := e.runs()
			for i := range 6 {
				if id := fmt.Sprintf("m-%d", i); runs[id] != 1 {
					t.Fatalf("%s ran %d times", id, runs[id])
				}
			}
		})
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	h := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	pool := &pgxpool.Pool{}
	for name, cfg := range map[string]*consumer.Config{
		"nil":          nil,
		"no brokers":   {Topic: "t", GroupID: "g", Handler: h},
		"no topic":     {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, GroupID: "g", Handler: h},
		"no group":     {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", Handler: h},
		"no handler":   {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g"},
		"bad batch":    {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g", Handler: h, BatchSize: -1},
		"bad name":     {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g\x00", Handler: h},
		"bad start":    {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g", Handler: h, StartOffset: 7},
		"both handler": {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g", Handler: h, BatchHandler: consumer.BatchHandlerFunc(nil)},
		"heartbeat over session": {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g", Handler: h,
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 6 * time.Second},
		"heartbeat over rebalance": {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g", Handler: h,
			RebalanceTimeout: time.Second, HeartbeatInterval: 2 * time.Second},
		"negative buffer":   {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g", Handler: h, MaxBufferedBytes: -1},
		"negative outage":   {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g", Handler: h, MaxOutage: -time.Second},
		"unknown recreated": {Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g", Handler: h, OnRecreated: 7},
	} {
		if _, err := consumer.New(pool, cfg); !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Errorf("%s: New returned %v, want ErrInvalidConfig", name, err)
		}
	}
	valid := &consumer.Config{Kafka: kafkaconn.Config{Brokers: []string{"b"}}, Topic: "t", GroupID: "g", Handler: h}
	if _, err := consumer.New(nil, valid); !errors.Is(err, consumer.ErrInvalidConfig) {
		t.Errorf("nil pool: New returned %v, want ErrInvalidConfig", err)
	}
	if _, err := consumer.New(pool, valid); err != nil {
		t.Errorf("valid config: %v", err)
	}
}

// appliedOrder returns the message IDs in the order their effects committed.
func (e *env) appliedOrder() []string {
	e.t.Helper()
	rows, err := e.db.Pool.Query(context.Background(), `SELECT id FROM `+e.effects+` ORDER BY seq`)
	if err != nil {
		e.t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// TestNonBlockingKeepsPerKeyOrder: keys A, B and C interleaved on one
// partition; B's first message fails three times, then heals. A and C flow
// during B's failures; B's messages are parked behind its head and land in
// their original order once it heals.
func TestNonBlockingKeepsPerKeyOrder(t *testing.T) {
	t.Parallel()
	for _, md := range modes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			var msgs []kafka.Message
			for i := range 10 {
				for _, k := range []string{"A", "B", "C"} {
					msgs = append(msgs, msg(fmt.Sprintf("%s%d", k, i), k, 1))
				}
			}
			e.produce(msgs...)

			// B0 fails until it is parked, then twice more as a parked message.
			var parkedB0 atomic.Bool
			var failuresParked atomic.Int32
			oc := newOutcomes(len(msgs))
			cfg := e.config(md, func(ctx context.Context, m *consumer.Message) error {
				if m.ID != "B0" {
					return nil
				}
				if !parkedB0.Load() {
					return errors.New("B's dependency is down")
				}
				if failuresParked.Load() < 2 {
					failuresParked.Add(1)
					return errors.New("B's dependency is still down")
				}
				return nil
			})
			cfg.FailureMode = consumer.NonBlocking
			cfg.Retry = retry.Policy{MaxAttempts: 1} // park at the first failure
			// Parked retries wait at least 0.5 s (1 s ± 50%): far longer than A and C need.
			cfg.ParkedRetry = retry.Policy{InitialInterval: time.Second, MaxInterval: time.Second, MaxAttempts: 10}
			cfg.ParkedPoll = 20 * time.Millisecond
			testobs.Of(cfg).OnOutcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
				if m.ID == "B0" && o == consumer.Parked {
					parkedB0.Store(true)
				}
				oc.hook(ctx, m, o)
			}
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "all messages")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if failuresParked.Load() != 2 {
				t.Fatalf("parked B0 failed %d times, want 2", failuresParked.Load())
			}
			if p := oc.count(consumer.Parked); p != 10 {
				t.Fatalf("%d messages parked, want B0..B9", p)
			}
			order := e.appliedOrder()
			if len(order) != 30 {
				t.Fatalf("%d effects, want 30: %v", len(order), order)
			}
			pos := map[string]int{}
			for i, id := range order {
				pos[id] = i
			}
			for i := range 10 {
				for _, k := range []string{"A", "C"} {
					if id := fmt.Sprintf("%s%d", k, i); pos[id] > pos["B0"] {
						t.Fatalf("%s applied after B0 healed: other keys must flow during B's failures (order %v)", id, order)
					}
				}
				if i > 0 && pos[fmt.Sprintf("B%d", i)] < pos[fmt.Sprintf("B%d", i-1)] {
					t.Fatalf("B%d applied before B%d (order %v)", i, i-1, order)
				}
			}
			for id, n := range e.runs() {
				if n != 1 {
					t.Fatalf("%s ran %d times", id, n)
				}
			}
			var left int
			if err := e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+e.db.Table(migrate.ParkedMessagesDefault)).Scan(&left); err != nil || left != 0 {
				t.Fatalf("%d messages still parked (%v)", left, err)
			}
		})
	}
}

// TestOtherPartitionsFlow: in blocking mode, a message retrying in place
// holds only its own partition.
func TestOtherPartitionsFlow(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 2)
			// Keys "k0" and "k1" hash to different partitions of two (checked below).
			var msgs []kafka.Message
			for i := range 10 {
				msgs = append(msgs, msg(fmt.Sprintf("x%d", i), "k0", 1), msg(fmt.Sprintf("y%d", i), "k1", 1))
			}
			e.produce(msgs...)
			healed := make(chan struct{})
			var sawOthers atomic.Bool
			oc := newOutcomes(len(msgs))
			cfg := e.config(md, func(ctx context.Context, m *consumer.Message) error {
				if m.ID == "x0" {
					select {
					case <-healed:
						return nil
					default:
						return errors.New("down")
					}
				}
				return nil
			})
			cfg.Retry = retry.Policy{InitialInterval: 50 * time.Millisecond, MaxInterval: 50 * time.Millisecond, MaxAttempts: -1}
			var mu sync.Mutex
			parts := map[string]int{}
			testobs.Of(cfg).OnOutcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
				mu.Lock()
				parts[string(m.Key)] = m.Partition
				mu.Unlock()
				if m.ID == "y9" && !sawOthers.Swap(true) {
					close(healed)
				}
				oc.hook(ctx, m, o)
			}
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "all messages")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if parts["k0"] == parts["k1"] {
				t.Fatalf("test setup: both keys landed on partition %d", parts["k0"])
			}
			if !sawOthers.Load() {
				t.Fatal("the other partition did not finish while x0 was failing")
			}
			if order := e.appliedOrder(); order[len(order)-10] != "x0" {
				t.Fatalf("x0 should follow all of y: order %v", order)
			}
		})
	}
}

// TestDeadlockRerunsTheTransaction: two partitions' handlers lock two rows in
// opposite orders; PostgreSQL aborts one transaction with a deadlock
// (40P01), the runner runs that transaction again, and both effects happen
// once, without counting a handler failure.
func TestDeadlockRerunsTheTransaction(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 2)
			ctx := context.Background()
			rows := e.db.Table("rows")
			if _, err := e.db.Pool.Exec(ctx, `CREATE TABLE `+rows+` (id text PRIMARY KEY, n int NOT NULL);
		INSERT INTO `+rows+` VALUES ('a', 0), ('b', 0)`); err != nil {
				t.Fatal(err)
			}
			// Keys k0 and k1 land on different partitions of two (checked below).
			e.produce(msg("x", "k0", 1), msg("y", "k1", 1))

			var attempts sync.Map
			var deadlocks atomic.Int32
			firstLocked := make(chan struct{}, 2)
			oc := newOutcomes(2)
			cfg := e.config(md, nil)
			// No handler retries: only the transaction rerun may save the deadlock victim.
			cfg.Retry = retry.Policy{MaxAttempts: 1}
			cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				n, _ := attempts.LoadOrStore(m.ID, new(atomic.Int32))
				attempt := n.(*atomic.Int32).Add(1)
				first, second := "a", "b"
				if m.ID == "y" {
					first, second = "b", "a"
				}
				if _, err := tx.Exec(ctx, `UPDATE `+rows+` SET n = n + 1 WHERE id = $1`, first); err != nil {
					return fmt.Errorf("lock %s: %w", first, err)
				}
				if attempt == 1 { // both hold their first row before either asks for the second
					firstLocked <- struct{}{}
					for len(firstLocked) < 2 {
						time.Sleep(time.Millisecond)
					}
				}
				if _, err := tx.Exec(ctx, `UPDATE `+rows+` SET n = n + 1 WHERE id = $1`, second); err != nil {
					var pgErr *pgconn.PgError
					if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
						deadlocks.Add(1)
					}
					return fmt.Errorf("lock %s: %w", second, err)
				}
				return e.effect(ctx, tx, m)
			})
			parts := sync.Map{}
			testobs.Of(cfg).OnOutcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
				parts.Store(m.ID, m.Partition)
				oc.hook(ctx, m, o)
			}
			stop := run(t, e.db.Pool, cfg)
			wait(t, oc.done, "both messages")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			px, _ := parts.Load("x")
			py, _ := parts.Load("y")
			if px == py {
				t.Fatalf("test setup: both messages on partition %v", px)
			}
			if runs := e.runs(); runs["x"] != 1 || runs["y"] != 1 {
				t.Fatalf("effects %v, want x and y once", runs)
			}
			// One of the two was the deadlock's victim; with no handler retries
			// (MaxAttempts 1) only the transaction's rerun brought it through: Run
			// did not stop and both effects are there. (A rebalance under load may
			// cancel and rerun an attempt too, so the handler's runs are not
			// counted exactly.)
			ax, _ := attempts.Load("x")
			ay, _ := attempts.Load("y")
			// Under load a rebalance may also rerun both attempts concurrently,
			// without the handshake above, and deadlock them again: each
			// deadlock costs its victim one more run.
			if d, total := deadlocks.Load(), ax.(*atomic.Int32).Load()+ay.(*atomic.Int32).Load(); d < 1 || total < 2+d {
				t.Fatalf("%d deadlocks in %d handler runs, want a deadlock and its transaction run again", d, total)
			}
			var a, b int
			if err := e.db.Pool.QueryRow(ctx, `SELECT (SELECT n FROM `+rows+` WHERE id='a'), (SELECT n FROM `+rows+` WHERE id='b')`).Scan(&a, &b); err != nil || a != 2 || b != 2 {
				t.Fatalf("rows a=%d b=%d (%v), want 2 and 2: the aborted attempt left nothing", a, b, err)
			}
		})
	}
}

// TestMissingTopicIsAnError: the runner never creates a topic, and a missing
// one is a clear error rather than a silent wait.
func TestMissingTopicIsAnError(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			cfg := e.config(md, nil)
			cfg.Topic = testenv.Name(t, "missing")
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := r.Run(ctx); !errors.Is(err, consumer.ErrTopicNotFound) || !strings.Contains(err.Error(), cfg.Topic) {
				t.Fatalf("Run on a missing topic: %v, want ErrTopicNotFound naming it", err)
			}
		})
	}
}

// TestTopicCreatedWhileStarting: a topic the brokers do not know yet when
// the runner starts (created a moment ago, not yet on the broker asked) is
// asked for again: created once the runner said it waits, it is consumed,
// and Run does not end.
func TestTopicCreatedWhileStarting(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	cfg := e.config(baseModes[0], nil)
	e.topic = testenv.Name(t, "late")
	cfg.Topic = e.topic
	logs, logger := testenv.NewLogs(t)
	cfg.Logger = logger
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	consumer.SetTopicWait(r, 5*time.Minute) // longer than the test
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	waitFor(t, "the runner to say the topic is unknown", func() (bool, string) {
		select {
		case err := <-ran:
			t.Fatalf("Run ended before the topic was created: %v", err)
		default:
		}
		n := logs.Count(consumer.TopicUnknownMsg, "")
		return n > 0, fmt.Sprintf("%d", n)
	})
	testenv.CreateTopic(t, e.topic, 1)
	e.produce(msg("late-1", "k", 1))
	waitFor(t, "late-1 to be applied", func() (bool, string) {
		runs := e.runs()
		return runs["late-1"] == 1, fmt.Sprintf("%v", runs)
	})
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestRetentionPurge: with Config.Retention the runner purges dedup records
// older than it, and only those; a redelivery of a purged ID counts as new.
func TestRetentionPurge(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			ctx := context.Background()
			processed := e.db.Table(migrate.ProcessedMessagesDefault)
			err := pgx.BeginFunc(ctx, e.db.Pool, func(tx pgx.Tx) error {
				for _, id := range []string{"old-1", "old-2", "recent"} {
					if _, err := e.store.ClaimTx(ctx, tx, dedup.Claim{Consumer: e.group, MessageID: id, Topic: e.topic}); err != nil {
						return err
					}
				}
				_, err := tx.Exec(ctx, `UPDATE `+processed+` SET processed_at = now() - interval '2 hours' WHERE message_id LIKE 'old-%'`)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			e.produce(msg("old-1", "k", 1), msg("recent", "k", 1))

			purged := make(chan int64, 10)
			oc := newOutcomes(2)
			cfg := e.config(md, nil)
			cfg.Retention = time.Hour
			cfg.PurgeInterval = 20 * time.Millisecond
			testobs.Of(cfg).OnPurged = func(n int64) {
				select { // hooks run on the runner's goroutines: never block them
				case purged <- n:
				default:
				}
			}
			first := make(chan struct{})
			testobs.Of(cfg).OnAssigned = func(string, int, int64) {
				// Let the first purge finish before any message is handled.
				<-first
			}
			testobs.Of(cfg).OnOutcome = oc.hook
			stop := run(t, e.db.Pool, cfg)
			var once sync.Once
			release := func() { once.Do(func() { close(first) }) }
			t.Cleanup(release) // runs before run's cleanup stops the runner
			select {
			case n := <-purged:
				if n != 2 {
					t.Fatalf("first purge deleted %d records, want the 2 older than the retention", n)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("no purge")
			}
			release()
			wait(t, oc.done, "both messages")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			oc.mu.Lock()
			defer oc.mu.Unlock()
			if got := oc.ids["old-1"]; len(got) != 1 || got[0] != consumer.Applied {
				t.Fatalf("old-1 after its record was purged: %v, want applied (it counts as new)", got)
			}
			if got := oc.ids["recent"]; len(got) != 1 || got[0] != consumer.Duplicate {
				t.Fatalf("recent: %v, want duplicate (its record is kept)", got)
			}
		})
	}
}

// TestConfigValidate: Validate refuses what New refuses, without a pool,
// and accepts a complete configuration.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := consumer.Config{Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}, Topic: "orders", GroupID: "billing",
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate of a complete config: %v", err)
	}
	for name, mutate := range map[string]func(*consumer.Config){
		"no topic":      func(c *consumer.Config) { c.Topic = "" },
		"no handler":    func(c *consumer.Config) { c.Handler = nil },
		"no brokers":    func(c *consumer.Config) { c.Kafka.Brokers = nil },
		"batch size":    func(c *consumer.Config) { c.BatchSize = -1 },
		"bad retry":     func(c *consumer.Config) { c.Retry.Multiplier = 0.5 },
		"bad observers": func(c *consumer.Config) { c.Observers = []consumer.Observer{42} },
	} {
		c := ok
		mutate(&c)
		if err := c.Validate(); !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", name, err)
		}
	}
	var nilCfg *consumer.Config
	if err := nilCfg.Validate(); !errors.Is(err, consumer.ErrInvalidConfig) {
		t.Errorf("nil config: Validate = %v, want ErrInvalidConfig", err)
	}
}

// A runner runs with the others of a service under idemkit.RunAll.
var _ idemkit.Runner = (*consumer.Runner)(nil)
