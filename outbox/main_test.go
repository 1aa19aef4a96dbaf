package outbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// newDB returns a fresh, migrated schema and a Store on it.
func newDB(t *testing.T) (*testenv.DB, *outbox.Store) {
	t.Helper()
	db := testenv.NewDB(t, migrateUp)
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	return db, store
}

func migrateUp(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return err
	}
	_, err = m.Up(ctx)
	return err
}

// enqueue commits msgs in one transaction and returns their IDs.
func enqueue(t testing.TB, pool *pgxpool.Pool, store *outbox.Store, msgs ...outbox.Message) []string {
	t.Helper()
	var ids []string
	err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		var err error
		ids, err = store.EnqueueTx(context.Background(), tx, msgs...)
		return err
	})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return ids
}

// published collects the records the relays report as published.
type published struct {
	mu   sync.Mutex
	ids  map[string]int
	cond chan struct{} // closed and replaced on every report
}

func newPublished() *published {
	return &published{ids: map[string]int{}, cond: make(chan struct{})}
}

func (p *published) hook(recs []outbox.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range recs {
		p.ids[r.ID]++
	}
	close(p.cond)
	p.cond = make(chan struct{})
}

// wait blocks until every id was reported, or fails the test after d.
func (p *published) wait(t *testing.T, d time.Duration, ids ...string) {
	t.Helper()
	deadline := time.After(d)
	for {
		p.mu.Lock()
		missing := 0
		for _, id := range ids {
			if p.ids[id] == 0 {
				missing++
			}
		}
		c := p.cond
		p.mu.Unlock()
		if missing == 0 {
			return
		}
		select {
		case <-c:
		case <-deadline:
			t.Fatalf("%d of %d messages not published after %v", missing, len(ids), d)
		}
	}
}

func (p *published) count(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ids[id]
}

// run starts r (a Relay or Dispatcher) and stops it at cleanup; Run must
// return nil.
func run(t *testing.T, r interface{ Run(context.Context) error }) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run returned %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func newRelay(t *testing.T, db *testenv.DB, store *outbox.Store, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Kafka.Brokers == nil {
		cfg.Kafka.Brokers = testenv.Brokers(t)
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	r, err := outbox.NewRelay(db.Pool, store, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readAll returns every message of topic, partition after partition, each
// in offset order.
func readAll(t *testing.T, brokers []string, topic string) []kafka.Message {
	t.Helper()
	return testenv.ReadAll(t, brokers, topic)
}

func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// checkKeyOrder checks, per key, that the first occurrences of the values
// are "<key>/0", "<key>/1", ... with none missing up to want[key], and
// returns how many duplicates it saw.
func checkKeyOrder(t *testing.T, msgs []kafka.Message, want map[string]int) (dups int) {
	t.Helper()
	next := map[string]int{}
	seen := map[string]bool{}
	for _, m := range msgs {
		id := header(m, outbox.HeaderID)
		if id == "" {
			t.Fatalf("message without %s header: %q", outbox.HeaderID, m.Value)
		}
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		key := string(m.Key)
		if v := fmt.Sprintf("%s/%d", key, next[key]); string(m.Value) != v {
			t.Fatalf("key %s: got %q, want %q next (partition %d offset %d)", key, m.Value, v, m.Partition, m.Offset)
		}
		next[key]++
	}
	for k, n := range want {
		if next[k] != n {
			t.Fatalf("key %s: %d messages in Kafka, want %d", k, next[k], n)
		}
	}
	if len(next) != len(want) {
		t.Fatalf("%d keys in Kafka, want %d", len(next), len(want))
	}
	return dups
}

// waitBacklog waits until the outbox has no pending message.
func waitBacklog(t *testing.T, db *testenv.DB, store *outbox.Store, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		st, err := store.Stats(context.Background(), db.Pool)
		if err != nil {
			t.Fatal(err)
		}
		if st.Backlog == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backlog still %+v after %v", st, d)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// newPool returns a pool of its own on the test server with an empty
// search_path and the given run-time parameters (application_name, ...),
// closed at cleanup: register it before the relays that use it, so that it
// outlives them.
func newPool(t *testing.T, params map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	for k, v := range params {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// repeatableReadPool is a pool whose transactions default to REPEATABLE
// READ, as a database configured so would give.
func repeatableReadPool(t *testing.T, appName string) *pgxpool.Pool {
	t.Helper()
	pool := newPool(t, map[string]string{"default_transaction_isolation": "repeatable read", "application_name": appName})
	var level string
	if err := pool.QueryRow(context.Background(), `SHOW default_transaction_isolation`).Scan(&level); err != nil || level != "repeatable read" {
		t.Fatalf("default_transaction_isolation = %q, %v", level, err)
	}
	return pool
}

// testLogger sends the relay's logs to t.Log: shown with -v or on failure.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}
