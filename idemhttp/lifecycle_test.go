package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/idemhttp"
)

// A key whose record expired runs anew.
func TestExpiredKeyRunsAnew(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.TTL = time.Hour })
	key := newKey()
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
	e.clock.Advance(59 * time.Minute)
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, true)
	e.clock.Advance(2 * time.Minute)
	// Expired: even another body is a new request now.
	want(t, e.post(key, "acct-1", `{"orderId":"order-843","amount":1,"currency":"BRL"}`), http.StatusCreated, false)
	wantPayments(t, e, 2)
	want(t, e.post(key, "acct-1", `{"orderId":"order-843","amount":1,"currency":"BRL"}`), http.StatusCreated, true)

	// Purge deletes expired records only, in batches.
	for range 5 {
		want(t, e.post(newKey(), "acct-2", payment), http.StatusCreated, false)
	}
	e.clock.Advance(2 * time.Hour)
	want(t, e.post(newKey(), "acct-3", payment), http.StatusCreated, false) // fresh
	deleted, err := e.store.Purge(context.Background(), e.db.Pool, 2)
	if err != nil || deleted != 6 {
		t.Fatalf("Purge = %d, %v; want 6", deleted, err)
	}
	var left int
	if err := e.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+
		e.db.Table("idempotency_records")).Scan(&left); err != nil || left != 1 {
		t.Fatalf("records left = %d, %v; want 1", left, err)
	}
}

// holdFirst makes the handler of the next request block after its insert
// until release is called; started is closed when it got there. A test that
// fails before releasing is released at cleanup, so that the server can close.
func holdFirst(e *env) (started chan struct{}, release func()) {
	started = make(chan struct{})
	gate := make(chan struct{})
	release = sync.OnceFunc(func() { close(gate) })
	e.t.Cleanup(release)
	first := true
	e.setAfter(func(r *http.Request) {
		e.hookMu.Lock()
		isFirst := first
		first = false
		e.hookMu.Unlock()
		if isFirst {
			close(started)
			<-gate
		}
	})
	return started, release
}

// A record whose lease ended is found and handed to
// the reconciler; AllowRetry lets the next request run, and the old holder,
// fenced out by its token, cannot complete: its writes roll back.
//
// The key is reserved by a record of its own (NoLeaseTakeover): in the
// default layout a request in flight has no record, and its lease ending
// frees the key by itself (TestLeaseTakeoverFencesLateHolder).
func TestLeaseExpiryReconcileAllowRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.Lease = 30 * time.Second; c.NoLeaseTakeover = true })
	ctx := context.Background()
	key := newKey()
	started, release := holdFirst(e)
	done := make(chan response, 1)
	go func() { done <- e.post(key, "acct-1", payment) }()
	<-started

	wantError(t, e.post(key, "acct-1", payment), http.StatusConflict, idemhttp.CodeInFlight)
	if stuck, err := e.store.FindStuck(ctx, e.db.Pool, 0); err != nil || len(stuck) != 0 {
		t.Fatalf("FindStuck within the lease = %v, %v; want none", stuck, err)
	}
	if n, err := e.store.CountStuck(ctx, e.db.Pool); err != nil || n != 0 {
		t.Fatalf("CountStuck within the lease = %d, %v; want 0", n, err)
	}
	e.clock.Advance(31 * time.Second)
	if n, err := e.store.CountStuck(ctx, e.db.Pool); err != nil || n != 1 {
		t.Fatalf("CountStuck past the lease = %d, %v; want 1", n, err)
	}
	var seen []idemhttp.Record
	n, err := e.store.Reconcile(ctx, e.db.Pool, idemhttp.ReconcilerFunc(
		func(_ context.Context, rec idemhttp.Record) (idemhttp.Decision, error) {
			seen = append(seen, rec)
			return idemhttp.AllowRetry, nil
		}), 10)
	if err != nil || n != 1 || len(seen) != 1 {
		t.Fatalf("Reconcile = %d, %v (saw %d); want 1 record", n, err, len(seen))
	}
	if rec := seen[0]; rec.Key != key || rec.Account != "acct-1" || rec.Operation != "POST /payments" ||
		rec.State != idemhttp.StateProcessing || len(rec.Fingerprint) != 32 {
		t.Fatalf("reconciler saw %+v", rec)
	}

	// The key is free: a new request runs while the old holder still hangs.
	second := e.post(key, "acct-1", payment)
	want(t, second, http.StatusCreated, false)
	release()
	wantError(t, <-done, http.StatusConflict, idemhttp.CodeLeaseLost)
	wantPayments(t, e, 1) // the old holder's insert rolled back
	r := e.post(key, "acct-1", payment)
	want(t, r, http.StatusCreated, true)
	if r.body != second.body {
		t.Fatalf("replay %v, want %v", r, second)
	}
}

// An expired record is taken over by a new request; the old holder is
// fenced out. (A record of its own, NoLeaseTakeover: in the default layout
// a request in flight has no record to expire.)
func TestExpiredRecordTakeoverFencesHolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) {
		c.NoLeaseTakeover = true
		c.Lease = 30 * time.Second
		c.TTL = time.Minute
	})
	key := newKey()
	started, release := holdFirst(e)
	done := make(chan response, 1)
	go func() { done <- e.post(key, "acct-1", payment) }()
	<-started
	e.clock.Advance(2 * time.Minute)
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
	release()
	wantError(t, <-done, http.StatusConflict, idemhttp.CodeLeaseLost)
	wantPayments(t, e, 1)
}

func TestReconcileMarkFailedAndKeepUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.NoTx = true; c.Lease = 10 * time.Second })
	ctx := context.Background()
	keyFailed, keyUnknown, keyError := newKey(), newKey(), newKey()
	// A holder past its lease that nobody took over still completes.
	for _, k := range []string{keyFailed, keyUnknown, keyError} {
		started, release := holdFirst(e)
		done := make(chan response, 1)
		go func() { done <- e.post(k, "acct-1", payment) }()
		<-started
		e.clock.Advance(11 * time.Second) // lease over
		release()
		want(t, <-done, http.StatusCreated, false)
	}
	// All three completed; reconcile finds nothing.
	if n, err := e.store.Reconcile(ctx, e.db.Pool, idemhttp.ReconcilerFunc(
		func(context.Context, idemhttp.Record) (idemhttp.Decision, error) {
			t.Error("reconciler called for a completed record")
			return idemhttp.KeepUnknown, nil
		}), 0); n != 0 || err != nil {
		t.Fatalf("Reconcile = %d, %v", n, err)
	}

	// Records that are stuck while the reconciler runs: held handlers of
	// records of their own (in the default layout a request in flight has no
	// record).
	e2 := newEnv(t, func(c *idemhttp.Config) { c.Lease = 10 * time.Second; c.NoLeaseTakeover = true })
	var releases []func()
	var dones []chan response
	for _, k := range []string{keyFailed, keyUnknown, keyError} {
		started, release := holdFirst(e2)
		done := make(chan response, 1)
		go func() { done <- e2.post(k, "acct-1", payment) }()
		<-started
		releases, dones = append(releases, release), append(dones, done)
	}
	e2.clock.Advance(11 * time.Second)
	boom := errors.New("provider unreachable")
	n, err := e2.store.Reconcile(ctx, e2.db.Pool, idemhttp.ReconcilerFunc(
		func(_ context.Context, rec idemhttp.Record) (idemhttp.Decision, error) {
			switch rec.Key {
			case keyFailed:
				return idemhttp.MarkFailed, nil
			case keyUnknown:
				return idemhttp.KeepUnknown, nil
			}
			return 0, boom
		}), 0)
	var rerr *idemhttp.ReconcileError
	if n != 2 || !errors.As(err, &rerr) || len(rerr.Errs) != 1 || !errors.Is(err, boom) {
		t.Fatalf("Reconcile = %d, %v; want 2 and one error wrapping boom", n, err)
	}
	for i := range releases {
		releases[i]()
		r := <-dones[i]
		if i < 2 {
			wantError(t, r, http.StatusConflict, idemhttp.CodeLeaseLost)
		} else {
			want(t, r, http.StatusCreated, false) // still its own: the reconciler failed on it
		}
	}
	wantPayments(t, e2, 1)
	wantError(t, e2.post(keyFailed, "acct-1", payment), http.StatusConflict, idemhttp.CodeOperationFailed)
	wantError(t, e2.post(keyUnknown, "acct-1", payment), http.StatusConflict, idemhttp.CodeOutcomeUnknown)
	if r := e2.post(keyUnknown, "acct-1", payment); r.header.Get("Retry-After") != "" {
		t.Fatalf("outcome_unknown with Retry-After: %v", r.header)
	}

	// An operator settles the UNKNOWN record: allow a retry.
	rec, err := e2.store.Get(ctx, e2.db.Pool, "acct-1", "POST /payments", keyUnknown)
	if err != nil || rec.State != idemhttp.StateUnknown {
		t.Fatalf("Get = %+v, %v", rec, err)
	}
	if stuck, err := e2.store.FindStuck(ctx, e2.db.Pool, 0); err != nil || len(stuck) != 0 {
		t.Fatalf("FindStuck lists %v, %v; want none (UNKNOWN is not stuck)", stuck, err)
	}
	if ok, err := e2.store.Resolve(ctx, e2.db.Pool, rec, idemhttp.AllowRetry); !ok || err != nil {
		t.Fatalf("Resolve = %v, %v", ok, err)
	}
	want(t, e2.post(keyUnknown, "acct-1", payment), http.StatusCreated, false)
	if _, err := e2.store.Get(ctx, e2.db.Pool, "acct-1", "POST /payments", newKey()); !errors.Is(err, idemhttp.ErrNotFound) {
		t.Fatalf("Get of an unknown key = %v, want ErrNotFound", err)
	}
	if _, err := e2.store.Resolve(ctx, e2.db.Pool, rec, 0); !errors.Is(err, idemhttp.ErrInvalidDecision) {
		t.Fatalf("Resolve(0) = %v, want ErrInvalidDecision", err)
	}
}

// A reconciler that panics leaves the record stuck and reports the panic.
func TestReconcilerPanic(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.Lease = 10 * time.Second; c.NoLeaseTakeover = true })
	started, release := holdFirst(e)
	done := make(chan response, 1)
	key := newKey()
	go func() { done <- e.post(key, "acct-1", payment) }()
	<-started
	e.clock.Advance(11 * time.Second)
	_, err := e.store.Reconcile(context.Background(), e.db.Pool, idemhttp.ReconcilerFunc(
		func(context.Context, idemhttp.Record) (idemhttp.Decision, error) { panic("reconciler bug") }), 0)
	var perr *idemkit.PanicError
	if !errors.As(err, &perr) || perr.Value != "reconciler bug" || len(perr.Stack) == 0 {
		t.Fatalf("Reconcile = %v, want a PanicError with a stack", err)
	}
	release()
	want(t, <-done, http.StatusCreated, false)
}
