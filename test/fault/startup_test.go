package fault

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
