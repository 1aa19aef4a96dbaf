package migrate_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// startingServer stands in front of the test server like a PostgreSQL that
// is starting up: until open is called, it answers every connection's
// startup message with FATAL 57P03 "the database system is starting up"
// and closes it; after, it relays connections to the test server.
type startingServer struct {
	ln      net.Listener
	target  string
	open    atomic.Bool
	refused atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func newStartingServer(t *testing.T) (*startingServer, string) {
	t.Helper()
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &startingServer{ln: ln, target: u.Host}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.close)
	u.Host = ln.Addr().String()
	return s, u.String()
}

func (s *startingServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(c)
		}()
	}
}

func (s *startingServer) serve(c net.Conn) {
	if !s.open.Load() {
		defer c.Close()
		b := pgproto3.NewBackend(c, c)
		for {
			msg, err := b.ReceiveStartupMessage()
			if err != nil {
				return
			}
			if _, ssl := msg.(*pgproto3.SSLRequest); ssl {
				if _, err := c.Write([]byte{'N'}); err != nil {
					return
				}
				continue
			}
			break
		}
		s.refused.Add(1)
		b.Send(&pgproto3.ErrorResponse{Severity: "FATAL", SeverityUnlocalized: "FATAL", Code: "57P03",
			Message: "the database system is starting up"})
		_ = b.Flush()
		return
	}
	up, err := net.Dial("tcp", s.target)
	if err != nil {
		c.Close()
		return
	}
	s.mu.Lock()
	s.conns = append(s.conns, up)
	s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(up, c)
		up.Close()
		close(done)
	}()
	_, _ = io.Copy(c, up)
	c.Close()
	<-done
}

func (s *startingServer) close() {
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// signalHandler is a slog handler that closes a channel at the first record
// with message msg, and passes every record to next.
type signalHandler struct {
	slog.Handler
	msg  string
	once *sync.Once
	ch   chan struct{}
}

func (h signalHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(func() { close(h.ch) })
	}
	return h.Handler.Handle(ctx, r)
}

func (h signalHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	h.Handler = h.Handler.WithAttrs(attrs)
	return h
}

func (h signalHandler) WithGroup(name string) slog.Handler {
	h.Handler = h.Handler.WithGroup(name)
	return h
}

// waitingLogger returns a logger that records to logs and a channel closed
// when Up logs that it waits for the server.
func waitingLogger(t *testing.T) (*testenv.Logs, *slog.Logger, <-chan struct{}) {
	logs, log := testenv.NewLogs(t)
	ch := make(chan struct{})
	return logs, slog.New(signalHandler{Handler: log.Handler(), msg: outage.StartMsg, once: new(sync.Once), ch: ch}), ch
}

func poolOn(t *testing.T, u string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

type upResult struct {
	applied []int
	err     error
}

func TestUpWaitsForStartingServer(t *testing.T) {
	t.Parallel()
	srv, u := newStartingServer(t)
	pool := poolOn(t, u)
	schema := testenv.Name(t, "m")
	dropSchemaAtCleanup(t, poolOn(t, testenv.DatabaseURL(t)), schema)
	logs, log, waiting := waitingLogger(t)
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res := make(chan upResult, 1)
	go func() {
		applied, err := m.Up(ctx)
		res <- upResult{applied, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("Up returned while the server was starting, without waiting: applied %v, err %v", r.applied, r.err)
	case <-waiting:
	case <-ctx.Done():
		t.Fatal("Up neither waited nor returned")
	}
	if srv.refused.Load() == 0 {
		t.Fatal("Up waits, but the server refused no connection")
	}
	srv.open.Store(true)
	r := <-res
	if r.err != nil {
		t.Fatalf("Up after the server started: %v", r.err)
	}
	wantInts(t, "applied", r.applied, migrate.Known()...)
	if n := logs.Count(outage.EndMsg, "migrate up"); n != 1 {
		t.Fatalf("%d %q logs, want 1", n, outage.EndMsg)
	}
	t.Logf("the server refused %d connections with 57P03 before it opened", srv.refused.Load())
}

func TestUpCancelledWhileWaiting(t *testing.T) {
	t.Parallel()
	_, u := newStartingServer(t) // never opens
	_, log, waiting := waitingLogger(t)
	m, err := migrate.New(poolOn(t, u), &migrate.Config{Tables: migrate.Tables{Schema: testenv.Name(t, "m")}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan upResult, 1)
	go func() {
		applied, err := m.Up(ctx)
		res <- upResult{applied, err}
	}()
	select {
	case r := <-res:
		t.Fatalf("Up returned while the server was starting, without waiting: applied %v, err %v", r.applied, r.err)
	case <-waiting:
	}
	cancel()
	var r upResult
	select {
	case r = <-res:
	case <-time.After(time.Minute):
		t.Fatal("Up did not return within a minute of its context's end")
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("Up = %v, want an error wrapping context.Canceled", r.err)
	}
	var pgErr *pgconn.PgError
	if !errors.As(r.err, &pgErr) || pgErr.Code != "57P03" {
		t.Fatalf("Up = %v, want it to wrap the server's last answer (57P03)", r.err)
	}
	if len(r.applied) != 0 {
		t.Fatalf("applied %v on a server that never opened", r.applied)
	}
	t.Logf("Up: %v", r.err)
}
