package idemhttp_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
)

// record returns the live record of key under acct-1 and POST /payments.
func (e *env) record(key string) idemhttp.Record {
	e.t.Helper()
	rec, err := e.store.Get(context.Background(), e.db.Pool, "acct-1", "POST /payments", key)
	if err != nil {
		e.t.Fatalf("Get %s: %v", key, err)
	}
	return rec
}

// The handler's context ends no later than its record's lease: from then on
// another request may take the record over, so the handler should stop.
func TestHandlerContextEndsWithLease(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.Lease = 30 * time.Second })
	key := newKey()
	var (
		deadline time.Time
		ok       bool
		rec      idemhttp.Record
	)
	e.setAfter(func(r *http.Request) {
		deadline, ok = r.Context().Deadline()
		rec = e.record(key) // the reservation, committed on its own
	})
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
	// The table keeps microseconds (pgx truncates): allow that much.
	if !ok || deadline.After(rec.LockedUntil.Add(time.Microsecond)) || deadline.Before(rec.LockedUntil.Add(-time.Second)) {
		t.Fatalf("handler deadline %v (set: %v), want at most the lease end %v", deadline, ok, rec.LockedUntil)
	}
}
