package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// reviewServer: one middleware per cfg on a shared store, handler h.
func reviewServer(t *testing.T, pool *pgxpool.Pool, store *idemhttp.Store, h http.HandlerFunc,
	tweak func(*idemhttp.Config)) (*httptest.Server, *logBuffer) {
	t.Helper()
	logs := &logBuffer{}
	cfg := &idemhttp.Config{Store: store, Account: accountFromHeader, FingerprintKeys: testKeys,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	if tweak != nil {
		tweak(cfg)
	}
	mw, err := idemhttp.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, logs
}

func reviewPool(t *testing.T, maxConns int32, afterConnect func(context.Context, *pgx.Conn) error) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.MaxConns = maxConns
	cfg.AfterConnect = afterConnect
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// R1: the fence needs a second pooled connection. With the pool exhausted
// (here MaxConns 1, the holder's own), the AfterFunc blocks in Acquire for
// finishTimeout (10 s) while holding h.mu; the handler that returns at 1.5 s
// is answered only at ~10 s, the key is not freed at the lease end, and the
// failed pg_terminate_backend is not logged.
// A holder past its lease is fenced on time even when the pool is exhausted
// (the fence uses a connection of its own).
func TestFenceWithExhaustedPool(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	pool := reviewPool(t, 1, nil)
	srv, logs := reviewServer(t, pool, store, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(1500 * time.Millisecond) // ignores its context (a provider call without ctx)
		w.WriteHeader(http.StatusCreated)
	}, func(c *idemhttp.Config) { c.Lease = 300 * time.Millisecond; c.TTL = time.Hour })
	start := time.Now()
	r, err := postTo(context.Background(), newClient(t), srv.URL+"/payments", newKey(), "acct-1", payment)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("answer %v after %v; logs: %q", r, took.Round(100*time.Millisecond), logs.String())
	if took > 3*time.Second {
		t.Fatalf("answered after %v: the fence waited for a pooled connection (handler took 1.5 s)", took)
	}
}

// R2: a client that hangs up before the lease ends disables the fence: the
// AfterFunc returns when ctx.Err() != nil. A handler that ignores its
// context keeps the transaction (and the key's lock) open past its lease;
// the next request with the key gets 409 instead of running, for as long as
// the handler runs (docs: "A handler still running when its lease ends is
// fenced out").
// A holder whose client hung up is still fenced at its lease end: the key
// is free 1 s later.
func TestFenceAfterClientGone(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	var runs atomic.Int32
	srv, _ := reviewServer(t, db.Pool, store, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			time.Sleep(4 * time.Second) // ignores its context
		}
		w.WriteHeader(http.StatusCreated)
	}, func(c *idemhttp.Config) { c.Lease = 500 * time.Millisecond; c.TTL = time.Hour })
	key := newKey()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond) // the client gives up
	defer cancel()
	_, _ = postTo(ctx, newClient(t), srv.URL+"/payments", key, "acct-1", payment)
	time.Sleep(1500 * time.Millisecond) // 1.5 s: three leases later
	r, err := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusCreated {
		t.Fatalf("1 s after the lease ended: got %v, want the handler to run (the holder fenced)", r)
	}
}

// R3: a record of a NoLeaseTakeover middleware (whose holder crashed, maybe
// after calling the provider) is taken over by a default-mode middleware on
// the same operation and store before any reconciler looked: the handler runs
// again. Config.NoLeaseTakeover and the CHANGELOG say "never taken over".
// A middleware of the default mode never takes over a record reserved by a
// NoLeaseTakeover middleware on the same operation (a rollout mixing both):
// that record waits for the reconciler.
func TestDefaultModeLeavesNoLeaseTakeoverRecords(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	var runs atomic.Int32
	release := make(chan struct{})
	defer close(release)
	h := func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			<-release // the first holder hangs (its effect at the provider already happened)
		}
		w.WriteHeader(http.StatusCreated)
	}
	lease := func(c *idemhttp.Config) { c.Lease = 300 * time.Millisecond; c.TTL = time.Hour }
	recSrv, _ := reviewServer(t, db.Pool, store, h, func(c *idemhttp.Config) { lease(c); c.NoLeaseTakeover = true })
	txSrv, _ := reviewServer(t, db.Pool, store, h, lease)
	key := newKey()
	go func() {
		_, _ = postTo(context.Background(), newClient(t), recSrv.URL+"/payments", key, "acct-1", payment)
	}()
	time.Sleep(800 * time.Millisecond)
	r1, _ := postTo(context.Background(), newClient(t), recSrv.URL+"/payments", key, "acct-1", payment)
	t.Logf("NoLeaseTakeover middleware: %v", r1)
	r2, _ := postTo(context.Background(), newClient(t), txSrv.URL+"/payments", key, "acct-1", payment)
	t.Logf("default middleware: %v", r2)
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler runs = %d before any reconciler settled the NoLeaseTakeover record, want 1", n)
	}
}

// R4: with Wait, SET LOCAL lock_timeout TO DEFAULT drops a session-level
// lock_timeout (AfterConnect SET): the handler runs with none at all.
// With Wait, the handler's statements run with the lock_timeout the session
// had (here set by AfterConnect), not the server default.
func TestWaitKeepsSessionLockTimeout(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	pool := reviewPool(t, 4, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET lock_timeout = '777ms'`)
		return err
	})
	var got string
	srv, _ := reviewServer(t, pool, store, func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.Tx(r.Context())
		_ = tx.QueryRow(r.Context(), `SHOW lock_timeout`).Scan(&got)
		w.WriteHeader(http.StatusCreated)
	}, func(c *idemhttp.Config) { c.Wait = time.Second })
	if _, err := postTo(context.Background(), newClient(t), srv.URL+"/payments", newKey(), "acct-1", payment); err != nil {
		t.Fatal(err)
	}
	if got != "777ms" {
		t.Fatalf("handler's lock_timeout = %q, want the configured 777ms", got)
	}
}

// R5: a waiter's lease starts before its wait: after waiting 900 ms for a
// holder that released (503), it has 100 ms of its 1 s lease left, and a
// 300 ms handler is fenced: 409 lease_lost.
// A waiter's lease starts when it holds the key, not when it began to wait.
func TestWaiterLeaseStartsWithItsHold(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	var runs atomic.Int32
	srv, _ := reviewServer(t, db.Pool, store, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			time.Sleep(900 * time.Millisecond)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}, func(c *idemhttp.Config) { c.Lease = time.Second; c.Wait = 3 * time.Second })
	key := newKey()
	go func() { _, _ = postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment) }()
	time.Sleep(50 * time.Millisecond)
	r, err := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != http.StatusCreated {
		t.Fatalf("waiter (300 ms handler, 1 s lease) got %v", r)
	}
}

// R6 (reference for the Redis finding): in NoTx mode on PostgreSQL a holder
// that finishes just past its lease, with nobody having taken its key, still
// completes: the retry is a replay.
// NoTx: a completion shortly after the lease, with nobody else holding the
// key, is kept: the retry replays (the Redis store must agree).
func TestNoTxLateCompletionKept(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	var runs atomic.Int32
	srv, _ := reviewServer(t, db.Pool, store, func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		time.Sleep(450 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}, func(c *idemhttp.Config) { c.Lease = 300 * time.Millisecond; c.TTL = time.Hour; c.NoTx = true })
	key := newKey()
	r1, _ := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
	r2, _ := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
	t.Logf("first %v, retry %v, runs %d", r1, r2, runs.Load())
	if runs.Load() != 1 {
		t.Fatalf("runs = %d", runs.Load())
	}
}

// R7: the transaction begins with the server's default isolation. Under
// default_transaction_isolation = 'repeatable read' (a role or database
// setting), the Wait path's read after pg_advisory_xact_lock uses the
// snapshot of the batch's first statement, taken before the wait: the waiter
// never sees the record its holder committed, runs the handler again, and
// gets 409 lease_lost (unique violation) instead of the replay.
// A session whose default isolation is REPEATABLE READ: the waiter still
// sees what the holder committed and replays it (the middleware's
// transaction is READ COMMITTED).
func TestWaitUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	pool := reviewPool(t, 4, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET default_transaction_isolation = 'repeatable read'`)
		return err
	})
	var runs atomic.Int32
	srv, _ := reviewServer(t, pool, store, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			time.Sleep(500 * time.Millisecond)
		}
		w.WriteHeader(http.StatusCreated)
	}, func(c *idemhttp.Config) { c.Wait = 5 * time.Second })
	key := newKey()
	done := make(chan response, 1)
	go func() {
		r, _ := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
		done <- r
	}()
	time.Sleep(100 * time.Millisecond)
	r, err := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first %v; waiter %v; runs %d", <-done, r, runs.Load())
	if !r.replayed() || runs.Load() != 1 {
		t.Fatalf("waiter got %v after %d runs, want the replay after 1", r, runs.Load())
	}
}
