package fault

import (
	"context"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/faultproxy"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/test/internal/pgproc"
)

// onMessage is a slog handler that closes ch at the first record with
// message msg and passes every record on.
type onMessage struct {
	slog.Handler
	msg  string
	once *sync.Once
	ch   chan struct{}
}

func (h onMessage) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.ch) })
	}
	return h.Handler.Handle(ctx, r)
}

func (h onMessage) WithAttrs(attrs []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(attrs)
	return h
}

func (h onMessage) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// TestMigrateUpWaitsForStoppedServer: a service that starts while its
// PostgreSQL is down (a server of the test's own, stopped) waits in
// migrate.Up, says so, and migrates once the server is started.
func TestMigrateUpWaitsForStoppedServer(t *testing.T) {
	t.Parallel()
	srv := pgproc.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := srv.Stop(ctx, pgproc.Fast); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	logs, log := testenv.NewLogs(t)
	waiting := make(chan struct{})
	log = slog.New(onMessage{Handler: log.Handler(), msg: outage.StartMsg, once: new(sync.Once), ch: waiting})
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: "idemkit"}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		applied []int
		err     error
	}
	res := make(chan result, 1)
	go func() {
		applied, err := m.Up(ctx)
		res <- result{applied, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("Up returned while the server was stopped, without waiting: applied %v, err %v", r.applied, r.err)
	case <-waiting:
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil {
		t.Fatalf("Up once the server started: %v", r.err)
	}
	if !slices.Equal(r.applied, migrate.Known()) {
		t.Fatalf("applied %v, want %v", r.applied, migrate.Known())
	}
	if n := logs.Count(outage.EndMsg, "migrate up"); n != 1 {
		t.Fatalf("%d %q logs, want 1", n, outage.EndMsg)
	}
}

// TestConsumerStartsBehindSilentPostgres: a consumer starts while every
// connection to PostgreSQL goes silent (accepted, never answered). Each of
// its start-up reads gives up after HandlerTimeout plus 10s, it says it
// waits for the server, and once the path clears it applies every message
// once, in order.
func TestConsumerStartsBehindSilentPostgres(t *testing.T) {
	t.Parallel()
	const n, partitions = 60, 3
	db := newDB(t)
	topic := testenv.NewTopic(t, partitions)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	table := db.Table("effects")
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFaultProxy(t, u.Host)
	proxy.Set(faultproxy.Blackhole)
	u.Host = proxy.Addr()
	ctx := context.Background()
	pool := testenv.PartPool(t, ctx, u.String(), "consumer-pg-silent-start", 8)
	waiting := make(chan struct{})
	_, log := testenv.NewLogs(t)
	log = slog.New(onMessage{Handler: log.Handler(), msg: outage.StartMsg, once: new(sync.Once), ch: waiting})
	cfg := consumer.Config{
		Kafka: testenv.Kafka(t), Topic: topic, GroupID: testenv.Name(t, "g"), Store: store, Logger: log,
		HandlerTimeout: time.Second,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			return applyEffect(ctx, tx, table, m)
		}),
	}
	r, err := consumer.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	}()
	produce(t, topic, "m-", 0, n, 10)
	select {
	case <-waiting:
	case err := <-done:
		done <- err
		t.Fatalf("Run returned while PostgreSQL was silent: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("the consumer did not say within a minute that it waits for a silent PostgreSQL")
	}
	proxy.Set(faultproxy.Pass)
	waitApplied(t, db, table, n, 2*time.Minute, "once PostgreSQL answers")
	checkAppliedOnce(t, db, n)
}
