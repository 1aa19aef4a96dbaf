package idemhttp_test

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
)

// deadToken is the token of records left by a holder that crashed: no
// request of the test holds it.
const deadToken = 7

// crashed leaves what a holder that crashed after its reservation leaves: a
// PROCESSING record for key with body's fingerprint, whose lease ended a
// second ago and whose token nobody holds. The fingerprint is taken from a
// completed request with another key (so the business table holds one
// payment more). It returns that record.
func (e *env) crashed(key, account, body string) idemhttp.Record {
	e.t.Helper()
	ctx := context.Background()
	donor := newKey()
	want(e.t, e.post(donor, account, body), http.StatusCreated, false)
	rec, err := e.store.Get(ctx, e.db.Pool, account, "POST /payments", donor)
	if err != nil {
		e.t.Fatalf("Get donor: %v", err)
	}
	now := e.clock.Now()
	if _, err := e.db.Pool.Exec(ctx, `INSERT INTO `+e.db.Table("idempotency_records")+` (account, operation,
		idempotency_key, fingerprint, state, token, locked_until, created_at, updated_at, expires_at)
		VALUES ($1, 'POST /payments', $2, $3, 'PROCESSING', $4, $5, $6, $6, $7)`,
		account, key, rec.Fingerprint, deadToken, now.Add(-time.Second), now.Add(-time.Hour),
		now.Add(23*time.Hour)); err != nil {
		e.t.Fatalf("insert crashed record: %v", err)
	}
	rec, err = e.store.Get(ctx, e.db.Pool, account, "POST /payments", key)
	if err != nil || rec.State != idemhttp.StateProcessing || rec.Token != deadToken {
		e.t.Fatalf("crashed record = %+v, %v", rec, err)
	}
	return rec
}

// A holder that crashed does not block its key for the
// TTL. In transaction mode the next request with the key and body takes the
// record over once its lease ended, runs the handler once, and later
// requests get the replay.
func TestLeaseTakeoverAfterCrash(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.Lease = 30 * time.Second })
	key := newKey()
	stuck := e.crashed(key, "acct-1", payment)
	wantPayments(t, e, 1) // the fingerprint donor's

	r := e.post(key, "acct-1", payment)
	want(t, r, http.StatusCreated, false)
	wantPayments(t, e, 2)
	rec := e.record(key)
	if rec.State != idemhttp.StateCompleted || rec.Token == deadToken || !rec.CreatedAt.Equal(stuck.CreatedAt) ||
		!rec.ExpiresAt.After(stuck.ExpiresAt) {
		t.Fatalf("record after the takeover = %+v, was %+v; want COMPLETED with a new token, the first "+
			"reservation's created_at and a later expiry", rec, stuck)
	}
	for range 3 {
		replay := e.post(key, "acct-1", payment)
		want(t, replay, http.StatusCreated, true)
		if replay.body != r.body {
			t.Fatalf("replay %v, want %v", replay, r)
		}
	}
	wantPayments(t, e, 2)
	if logs := e.logs.String(); !strings.Contains(logs, "lease ended") || !strings.Contains(logs, "previous_token=7") {
		t.Fatalf("the takeover was not logged with the previous token:\n%s", logs)
	}
}

// awaitTaken posts key until the answer is not 409 request_in_flight (the
// holder's lease ended and its hold was fenced), at most 20 seconds.
func (e *env) awaitTaken(key string) response {
	e.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		r := e.post(key, "acct-1", payment)
		if r.status != http.StatusConflict || r.code() != idemhttp.CodeInFlight || time.Now().After(deadline) {
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A holder still running when its lease ends is fenced out (the
// lock layout): its session is ended, which rolls its transaction back and
// frees the key, the next request runs, and the old holder, completing
// late, gets 409 lease_lost with nothing committed.
func TestLeaseTakeoverFencesLateHolder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.Lease = time.Second })
	key := newKey()
	started, release := holdFirst(e) // the first request has inserted its payment and blocks, ignoring its context
	done := make(chan response, 1)
	go func() { done <- e.post(key, "acct-1", payment) }()
	<-started

	wantError(t, e.post(key, "acct-1", payment), http.StatusConflict, idemhttp.CodeInFlight) // lease running
	second := e.awaitTaken(key)
	want(t, second, http.StatusCreated, false)

	release()
	late := <-done
	wantError(t, late, http.StatusConflict, idemhttp.CodeLeaseLost)
	if late.header.Get("Retry-After") != "1" {
		t.Fatalf("lease_lost without Retry-After: 1: %v", late.header)
	}
	wantPayments(t, e, 1) // the late holder's insert was rolled back
	var id int64
	if err := e.db.Pool.QueryRow(context.Background(), "SELECT id FROM "+e.db.Table("payments")).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(second.body, `"id":`+strconv.FormatInt(id, 10)+`,`) {
		t.Fatalf("the committed payment %d is not the taker's %v", id, second)
	}
	r := e.post(key, "acct-1", payment)
	want(t, r, http.StatusCreated, true)
	if r.body != second.body {
		t.Fatalf("replay %v, want %v", r, second)
	}
}

// A holder fenced out while the taker still runs may fail (here: panic)
// rather than complete: its release does not free the taker's hold.
func TestLeaseTakeoverLateHolderFailsWhileTakerRuns(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.Lease = time.Second })
	key := newKey()
	var (
		mu      sync.Mutex
		calls   int
		started = [2]chan struct{}{make(chan struct{}), make(chan struct{})}
		gates   = [2]chan struct{}{make(chan struct{}), make(chan struct{})}
	)
	release := [2]func(){sync.OnceFunc(func() { close(gates[0]) }), sync.OnceFunc(func() { close(gates[1]) })}
	t.Cleanup(release[0])
	t.Cleanup(release[1])
	e.setAfter(func(r *http.Request) {
		mu.Lock()
		i := calls
		calls++
		mu.Unlock()
		if i > 1 {
			t.Errorf("handler call %d: want two", i+1)
			return
		}
		close(started[i])
		<-gates[i]
		if i == 0 {
			panic("the old holder fails after its lease")
		}
	})
	first, second := make(chan response, 1), make(chan response, 1)
	go func() { first <- e.post(key, "acct-1", payment) }()
	<-started[0]
	go func() {
		for deadline := time.Now().Add(20 * time.Second); ; {
			r := e.post(key, "acct-1", payment)
			if r.status != http.StatusConflict || time.Now().After(deadline) {
				second <- r
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	select {
	case <-started[1]: // the second request holds the key after the lease ended, and runs
	case r := <-second:
		t.Fatalf("the second request did not take the key over: %v", r)
	}

	release[0]()
	wantError(t, <-first, http.StatusInternalServerError, idemhttp.CodeInternal)
	// The taker's hold survived the old holder's release.
	wantError(t, e.post(key, "acct-1", payment), http.StatusConflict, idemhttp.CodeInFlight)
	release[1]()
	taken := <-second
	want(t, taken, http.StatusCreated, false)
	wantPayments(t, e, 1)
	r := e.post(key, "acct-1", payment)
	want(t, r, http.StatusCreated, true)
	if r.body != taken.body {
		t.Fatalf("replay %v, want %v", r, taken)
	}
}

// Of many requests racing for one record whose lease ended, exactly one
// takes it over and runs; the others find a live lease (409
// request_in_flight) or, with Wait, get its replay.
func TestLeaseTakeoverRace(t *testing.T) {
	t.Parallel()
	const n = 20
	t.Run("in flight", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, func(c *idemhttp.Config) { c.Lease = 30 * time.Second })
		key := newKey()
		e.crashed(key, "acct-1", payment)
		var calls, answered atomic.Int32
		othersAnswered := make(chan struct{})
		// The taker holds the record until every other request was answered,
		// so that they all meet the taken record (bounded, in case not).
		e.setAfter(func(r *http.Request) {
			calls.Add(1)
			select {
			case <-othersAnswered:
			case <-time.After(20 * time.Second):
			case <-r.Context().Done():
			}
		})
		results := make([]response, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				results[i] = e.post(key, "acct-1", payment)
				if answered.Add(1) == n-1 {
					close(othersAnswered)
				}
			})
		}
		wg.Wait()
		executed := 0
		for _, r := range results {
			switch {
			case r.status == http.StatusCreated && !r.replayed():
				executed++
			case r.status == http.StatusConflict && r.code() == idemhttp.CodeInFlight:
			default:
				t.Fatalf("unexpected answer %v", r)
			}
		}
		if executed != 1 || calls.Load() != 1 {
			t.Fatalf("%d executions, %d handler calls; want 1 and 1", executed, calls.Load())
		}
		wantPayments(t, e, 2) // the donor's and the taker's
	})
	t.Run("wait", func(t *testing.T) {
		t.Parallel()
		var arrived atomic.Int32
		allArrived := make(chan struct{})
		e := newEnv(t, func(c *idemhttp.Config) {
			c.Lease = 30 * time.Second
			c.Wait, c.MaxWaiters, c.MaxKeyWaiters = 30*time.Second, 64, 64
			c.Account = func(r *http.Request) (string, error) {
				if r.Header.Get("X-Race") != "" && arrived.Add(1) == n {
					close(allArrived)
				}
				return accountFromHeader(r)
			}
		})
		key := newKey()
		e.crashed(key, "acct-1", payment)
		var calls atomic.Int32
		e.setAfter(func(r *http.Request) {
			calls.Add(1)
			select {
			case <-allArrived:
			case <-r.Context().Done():
			}
		})
		results := make([]response, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/payments", strings.NewReader(payment))
				if err != nil {
					errs[i] = err
					return
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(idemhttp.HeaderKey, key)
				req.Header.Set("X-Account", "acct-1")
				req.Header.Set("X-Race", "1")
				results[i], errs[i] = do(e.client, req)
			})
		}
		wg.Wait()
		executed := 0
		for i, r := range results {
			if errs[i] != nil {
				t.Fatalf("request %d: %v", i, errs[i])
			}
			switch {
			case r.status == http.StatusCreated && !r.replayed():
				executed++
			case r.status == http.StatusCreated:
			default:
				t.Fatalf("unexpected answer %v", r)
			}
		}
		if executed != 1 || calls.Load() != 1 {
			t.Fatalf("%d executions, %d handler calls; want 1 and 1", executed, calls.Load())
		}
		wantPayments(t, e, 2)
	})
}

// A request with another body never takes a record over: 422, whatever the
// lease, and the record stays as it was.
func TestLeaseTakeoverFingerprintMismatch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.Lease = 30 * time.Second })
	key := newKey()
	stuck := e.crashed(key, "acct-1", payment)
	wantError(t, e.post(key, "acct-1", `{"orderId":"order-842","amount":25000,"currency":"BRL"}`),
		http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
	if rec := e.record(key); !sameRecord(rec, stuck) {
		t.Fatalf("record after a 422 = %+v, want it untouched: %+v", rec, stuck)
	}
	wantPayments(t, e, 1)
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, false) // the right body takes it over
	wantPayments(t, e, 2)
}

// Reconciler-only: with NoLeaseTakeover, and always with NoTx, a record
// whose lease ended keeps answering 409 request_in_flight until a Reconciler
// settles it.
func TestNoLeaseTakeover(t *testing.T) {
	t.Parallel()
	for name, tweak := range map[string]func(*idemhttp.Config){
		"NoLeaseTakeover": func(c *idemhttp.Config) { c.NoLeaseTakeover = true },
		"NoTx":            func(c *idemhttp.Config) { c.NoTx = true },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *idemhttp.Config) {
				c.Lease = 30 * time.Second
				tweak(c)
			})
			key := newKey()
			stuck := e.crashed(key, "acct-1", payment)
			for range 2 {
				wantError(t, e.post(key, "acct-1", payment), http.StatusConflict, idemhttp.CodeInFlight)
				e.clock.Advance(time.Hour) // long past the lease, within the TTL
			}
			if rec := e.record(key); !sameRecord(rec, stuck) {
				t.Fatalf("record = %+v, want it untouched: %+v", rec, stuck)
			}
			wantPayments(t, e, 1)
			n, err := e.store.Reconcile(context.Background(), e.db.Pool, idemhttp.ReconcilerFunc(
				func(context.Context, idemhttp.Record) (idemhttp.Decision, error) { return idemhttp.AllowRetry, nil }), 0)
			if n != 1 || err != nil {
				t.Fatalf("Reconcile = %d, %v; want 1", n, err)
			}
			want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
			wantPayments(t, e, 2)
		})
	}
}

// sameRecord reports whether a and b are the same version of a record.
func sameRecord(a, b idemhttp.Record) bool {
	return a.Token == b.Token && a.State == b.State && a.LockedUntil.Equal(b.LockedUntil) &&
		a.UpdatedAt.Equal(b.UpdatedAt) && a.ExpiresAt.Equal(b.ExpiresAt) && bytes.Equal(a.Fingerprint, b.Fingerprint)
}

// The completion is the backstop of the lock: a record that
// appeared for the key while a request held its lock (a holder that
// committed between the snapshot of the reading statement and the grant of
// the lock; here, written by hand) makes the completion fail on the unique
// key, so that the holder's transaction rolls back: 409 lease_lost, no
// second payment, and the record that was there stays.
func TestCompletionMeetsARecordWrittenMeanwhile(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := newKey()
	started, release := holdFirst(e)
	done := make(chan response, 1)
	go func() { done <- e.post(key, "acct-1", payment) }()
	<-started
	now := e.clock.Now()
	if _, err := e.db.Pool.Exec(context.Background(), `INSERT INTO `+e.db.Table("idempotency_records")+` (account,
		operation, idempotency_key, fingerprint, state, token, response_status, response_headers, response_body,
		created_at, updated_at, completed_at, expires_at)
		VALUES ('acct-1', 'POST /payments', $1, '\x00', 'COMPLETED', 5, 201, '{}', 'theirs', $2, $2, $2, $3)`,
		key, now, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	release()
	wantError(t, <-done, http.StatusConflict, idemhttp.CodeLeaseLost)
	wantPayments(t, e, 0)
	if rec := e.record(key); rec.Token != 5 || rec.State != idemhttp.StateCompleted {
		t.Fatalf("record = %+v, want the one written meanwhile", rec)
	}
}
