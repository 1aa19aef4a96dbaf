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

// serverOn serves POST /payments with handler h behind a middleware on
// pool and store, configured by tweak.
func serverOn(t *testing.T, pool *pgxpool.Pool, store *idemhttp.Store, h http.HandlerFunc,
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

// poolOf is a pool of maxConns connections whose sessions run afterConnect
// and carry an application name of the test's own (see awaitWaiter).
func poolOf(t *testing.T, maxConns int32, afterConnect func(context.Context, *pgx.Conn) error) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.ConnConfig.RuntimeParams["application_name"] = appName(t)
	cfg.MaxConns = maxConns
	cfg.AfterConnect = afterConnect
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// A holder past its lease is fenced on time even when the pool is exhausted
// (the fence uses a connection of its own).
func TestFenceWithExhaustedPool(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	pool := poolOf(t, 1, nil)
	srv, logs := serverOn(t, pool, store, func(w http.ResponseWriter, r *http.Request) {
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

// A holder whose client hung up is still fenced at its lease end: the key
// is free long before its handler, which ignores its context, returns.
func TestFenceAfterClientGone(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	srv, _ := serverOn(t, db.Pool, store, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-release // ignores its context; returns when the test ends
		}
		w.WriteHeader(http.StatusCreated)
	}, func(c *idemhttp.Config) { c.Lease = 500 * time.Millisecond; c.TTL = time.Hour })
	t.Cleanup(func() { close(release) }) // before the server closes
	key := newKey()
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan struct{})
	go func() {
		defer close(gone)
		_, _ = postTo(ctx, newClient(t), srv.URL+"/payments", key, "acct-1", payment)
	}()
	<-started
	cancel() // the client gives up
	<-gone
	// The next request runs once the holder is fenced (its lease ends 0.5 s
	// after it began): 409 until then.
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
		if err != nil {
			t.Fatal(err)
		}
		if r.status == http.StatusCreated {
			break
		}
		if r.status != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("after the holder's lease ended: got %v, want the handler to run (the holder fenced)", r)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

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
	started := make(chan struct{})
	h := func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-release // the first holder hangs (its effect at the provider already happened)
		}
		w.WriteHeader(http.StatusCreated)
	}
	lease := func(c *idemhttp.Config) { c.Lease = 300 * time.Millisecond; c.TTL = time.Hour }
	recSrv, _ := serverOn(t, db.Pool, store, h, func(c *idemhttp.Config) { lease(c); c.NoLeaseTakeover = true })
	txSrv, _ := serverOn(t, db.Pool, store, h, lease)
	key := newKey()
	go func() {
		_, _ = postTo(context.Background(), newClient(t), recSrv.URL+"/payments", key, "acct-1", payment)
	}()
	<-started
	time.Sleep(800 * time.Millisecond) // the holder's 300 ms lease passes
	r1, _ := postTo(context.Background(), newClient(t), recSrv.URL+"/payments", key, "acct-1", payment)
	t.Logf("NoLeaseTakeover middleware: %v", r1)
	r2, _ := postTo(context.Background(), newClient(t), txSrv.URL+"/payments", key, "acct-1", payment)
	t.Logf("default middleware: %v", r2)
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler runs = %d before any reconciler settled the NoLeaseTakeover record, want 1", n)
	}
}

// With Wait, the handler's statements run with the lock_timeout the session
// had (here set by AfterConnect), not the server default.
func TestWaitKeepsSessionLockTimeout(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	pool := poolOf(t, 4, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET lock_timeout = '777ms'`)
		return err
	})
	var got string
	srv, _ := serverOn(t, pool, store, func(w http.ResponseWriter, r *http.Request) {
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

// A waiter's lease starts when it holds the key, not when it began to wait:
// a waiter that waited 900 ms of its 1 s lease for a holder that released
// (503) still has its whole lease for a 300 ms handler.
func TestWaiterLeaseStartsWithItsHold(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	pool := poolOf(t, 4, nil)
	var runs atomic.Int32
	started, waiting := make(chan struct{}), make(chan struct{})
	srv, _ := serverOn(t, pool, store, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-waiting
			time.Sleep(900 * time.Millisecond) // the waiter waits this long
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		time.Sleep(300 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
	}, func(c *idemhttp.Config) { c.Lease = time.Second; c.Wait = 30 * time.Second })
	key := newKey()
	go func() { _, _ = postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment) }()
	<-started
	res := make(chan response, 1)
	go func() {
		r, _ := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
		res <- r
	}()
	awaitWaiter(t, pool)
	close(waiting)
	if r := <-res; r.status != http.StatusCreated {
		t.Fatalf("waiter (300 ms handler, 1 s lease) got %v", r)
	}
}

// NoTx: a completion shortly after the lease, with nobody else holding the
// key, is kept: the retry replays (the Redis store must agree).
func TestNoTxLateCompletionKept(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	var runs atomic.Int32
	srv, _ := serverOn(t, db.Pool, store, func(w http.ResponseWriter, r *http.Request) {
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

// A session whose default isolation is REPEATABLE READ: the waiter still
// sees what the holder committed and replays it (the middleware's
// transaction is READ COMMITTED, and reads the record after the wait).
func TestWaitUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, _ := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	pool := poolOf(t, 4, func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET default_transaction_isolation = 'repeatable read'`)
		return err
	})
	var runs atomic.Int32
	started, release := make(chan struct{}), make(chan struct{})
	srv, _ := serverOn(t, pool, store, func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}, func(c *idemhttp.Config) { c.Wait = 30 * time.Second })
	key := newKey()
	first := make(chan response, 1)
	go func() {
		r, _ := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
		first <- r
	}()
	<-started
	waiter := make(chan response, 1)
	go func() {
		r, _ := postTo(context.Background(), newClient(t), srv.URL+"/payments", key, "acct-1", payment)
		waiter <- r
	}()
	awaitWaiter(t, pool) // the waiter waits on the holder's lock
	close(release)
	f, r := <-first, <-waiter
	t.Logf("first %v; waiter %v; runs %d", f, r, runs.Load())
	if f.replayed() || !r.replayed() || runs.Load() != 1 {
		t.Fatalf("waiter got %v after %d runs, want the replay after 1", r, runs.Load())
	}
}

// appName is an application name unique to the test: its sessions are
// found by it in pg_stat_activity.
func appName(t *testing.T) string { return testenv.Name(t, "idemhttp") }

// awaitWaiter returns once a session of pool's application waits for an
// advisory lock (a request waiting for the holder of its key), or fails the
// test after 30 seconds.
func awaitWaiter(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	name := pool.Config().ConnConfig.RuntimeParams["application_name"]
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_catalog.pg_locks AS l
			JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1`, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no request waits for the key's holder")
		}
	}
}
