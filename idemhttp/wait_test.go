package idemhttp_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/idemhttp"
)

// awaitLockWaiter returns once a request waits, in PostgreSQL, on an
// advisory lock of the key's holder (in transaction mode the lock of its
// fingerprint; with a record of its own, the lock on its token), or fails
// the test after 20 seconds.
func (e *env) awaitLockWaiter(key string) {
	e.t.Helper()
	token := e.store.LockKey("acct-1", "POST /payments", key)
	if rec, err := e.store.Get(context.Background(), e.db.Pool, "acct-1", "POST /payments", key); err == nil {
		token = rec.Token
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		var waiting int
		// A lock the holder of token holds (in transaction mode the lock of
		// the key's fingerprint, which waiters wait on).
		if err := e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_catalog.pg_locks AS w
			JOIN pg_catalog.pg_locks AS h ON h.locktype = 'advisory' AND h.granted
				AND h.classid = w.classid AND h.objid = w.objid AND h.objsubid = w.objsubid
			WHERE w.locktype = 'advisory' AND w.objsubid = 1 AND NOT w.granted
			AND h.pid IN (SELECT pid FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted
				AND objsubid = 1 AND (classid::bigint << 32 | objid::bigint) = $1)`, token).Scan(&waiting); err != nil {
			e.t.Fatalf("pg_locks: %v", err)
		}
		if waiting > 0 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Say which advisory locks there are, to tell a waiter on another key
	// from none.
	if rows, err := e.db.Pool.Query(context.Background(), `SELECT classid::bigint << 32 | objid::bigint, granted, pid
		FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND objsubid = 1`); err == nil {
		var (
			key     int64
			granted bool
			pid     int
		)
		_, _ = pgx.ForEachRow(rows, []any{&key, &granted, &pid}, func() error {
			e.t.Logf("advisory lock %d granted=%v pid=%d", key, granted, pid)
			return nil
		})
	}
	e.t.Fatalf("no request waits on the advisory lock of token %d", token)
}

// With Wait, a duplicate of a request in flight waits on its holder's lock
// (not by polling the record) and, woken when the holder commits, replays
// its response.
func TestWaitWokenByHolder(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode func(*idemhttp.Config)) {
		e := newEnv(t, mode, func(c *idemhttp.Config) { c.Wait = 30 * time.Second })
		key := newKey()
		started, release := holdFirst(e)
		first, second := make(chan response, 1), make(chan response, 1)
		go func() { first <- e.post(key, "acct-1", payment) }()
		<-started
		go func() { second <- e.post(key, "acct-1", payment) }()
		e.awaitLockWaiter(key)
		select {
		case r := <-second:
			t.Fatalf("the duplicate was answered while the first is in flight: %v", r)
		default:
		}
		release()
		f, s := <-first, <-second
		want(t, f, http.StatusCreated, false)
		want(t, s, http.StatusCreated, true)
		if s.body != f.body || s.header.Get("Location") != f.header.Get("Location") {
			t.Fatalf("replay %v, want %v", s, f)
		}
		wantPayments(t, e, 1)
	})
}

// When Wait ends before the holder does, the duplicate gets the usual 409
// request_in_flight; the holder still completes, and is replayed later.
func TestWaitExpires(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.Wait = 200 * time.Millisecond })
	key := newKey()
	started, release := holdFirst(e)
	first := make(chan response, 1)
	go func() { first <- e.post(key, "acct-1", payment) }()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := e.tryPost(ctx, key, "acct-1", payment) // the holder is held far longer than Wait
	if err != nil {
		t.Fatalf("the duplicate was not answered once Wait was over: %v", err)
	}
	wantError(t, r, http.StatusConflict, idemhttp.CodeInFlight)
	release()
	f := <-first
	want(t, f, http.StatusCreated, false)
	r = e.post(key, "acct-1", payment)
	want(t, r, http.StatusCreated, true)
	if r.body != f.body {
		t.Fatalf("replay %v, want %v", r, f)
	}
	wantPayments(t, e, 1)
}

// A duplicate waiting for a holder that fails with a retryable status (its
// transaction rolled back, its key released) is woken and runs the handler
// itself: one payment, from the duplicate.
func TestWaitHolderFails(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode func(*idemhttp.Config)) {
		e := newEnv(t, mode, func(c *idemhttp.Config) { c.Wait = 30 * time.Second })
		key := newKey()
		var (
			calls   atomic.Int32
			started = make(chan struct{})
			gate    = make(chan struct{})
		)
		open := sync.OnceFunc(func() { close(gate) })
		t.Cleanup(open)
		e.setHook(func(w http.ResponseWriter, r *http.Request) bool {
			if calls.Add(1) > 1 {
				return false // the duplicate runs normally
			}
			tx, _ := idemhttp.Tx(r.Context())
			if _, err := tx.Exec(r.Context(), "INSERT INTO "+e.db.Table("payments")+
				" (account, order_id, amount) VALUES ('acct-1', 'lost', 1)"); err != nil {
				t.Errorf("insert: %v", err)
			}
			close(started)
			<-gate
			http.Error(w, "gateway down", http.StatusServiceUnavailable)
			return true
		})
		first, second := make(chan response, 1), make(chan response, 1)
		go func() { first <- e.post(key, "acct-1", payment) }()
		<-started
		go func() { second <- e.post(key, "acct-1", payment) }()
		e.awaitLockWaiter(key)
		open()
		if r := <-first; r.status != http.StatusServiceUnavailable {
			t.Fatalf("first = %v, want its 503", r)
		}
		want(t, <-second, http.StatusCreated, false)
		if calls.Load() != 2 {
			t.Fatalf("handler calls = %d, want 2", calls.Load())
		}
		wantPayments(t, e, 1) // the first's insert rolled back, the duplicate's committed
		want(t, e.post(key, "acct-1", payment), http.StatusCreated, true)
	})
}

// holdKeyLockOnly holds, in a transaction of its own, the advisory lock of
// key and no lock of any fingerprint: what a holder's session looks like
// while its ending transaction frees its locks one by one, the fingerprint's
// first. The returned function ends that transaction.
func (e *env) holdKeyLockOnly(key string) func() {
	e.t.Helper()
	ctx := context.Background()
	tx, err := e.db.Pool.Begin(ctx)
	if err != nil {
		e.t.Fatalf("begin: %v", err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_catalog.pg_advisory_xact_lock($1)`,
		e.store.LockKey("acct-1", "POST /payments", key)); err != nil {
		e.t.Fatalf("lock: %v", err)
	}
	var once sync.Once
	end := func() { once.Do(func() { _ = tx.Rollback(ctx) }) }
	e.t.Cleanup(end)
	return end
}

// A key whose lock is held while no lock of its fingerprint is, as a
// holder's ending transaction leaves it for an instant, is not taken for a
// request with another body: a duplicate that looks in that instant runs
// once the lock is free.
func TestKeyHeldWithoutFingerprintIsLookedAtAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(c *idemhttp.Config) { c.Wait = 30 * time.Second })
	key := newKey()
	end := e.holdKeyLockOnly(key)
	var looks atomic.Int32
	e.store.OnMismatchLook(func() {
		looks.Add(1)
		end() // the holder's transaction has ended
	})
	r := e.post(key, "acct-1", payment)
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("got %v, want the run's 201", r)
	}
	if n := looks.Load(); n != 1 {
		t.Fatalf("%d looks found another fingerprint, want 1", n)
	}
	if n := e.payments(); n != 1 {
		t.Fatalf("%d payments, want 1", n)
	}
}

// A key that stays held by a request with another fingerprint is answered
// 422 after a few looks, and its handler never runs.
func TestKeyHeldByAnotherFingerprint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil, func(c *idemhttp.Config) { c.Wait = 30 * time.Second })
	key := newKey()
	e.holdKeyLockOnly(key)
	var looks atomic.Int32
	e.store.OnMismatchLook(func() { looks.Add(1) })
	r := e.post(key, "acct-1", payment)
	if r.status != http.StatusUnprocessableEntity || r.code() != idemhttp.CodeKeyReused {
		t.Fatalf("got %v, want 422 %s", r, idemhttp.CodeKeyReused)
	}
	if n := looks.Load(); n < 2 {
		t.Fatalf("%d looks found another fingerprint, want it looked at again", n)
	}
	if n := e.payments(); n != 0 {
		t.Fatalf("%d payments, want none", n)
	}
}
