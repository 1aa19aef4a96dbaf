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

// The handler's context ends when its lease does: from then on another
// request may hold the key, so the handler should stop.
func TestHandlerContextEndsWithLease(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode func(*idemhttp.Config)) {
		const lease = 30 * time.Second
		e := newEnv(t, mode, func(c *idemhttp.Config) { c.Lease = lease })
		key := newKey()
		var (
			deadline, entered time.Time
			ok                bool
		)
		e.setAfter(func(r *http.Request) {
			entered = time.Now()
			deadline, ok = r.Context().Deadline()
		})
		before := time.Now()
		want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
		if !ok || deadline.Before(before.Add(lease)) || deadline.After(entered.Add(lease)) {
			t.Fatalf("handler deadline %v (set: %v), want the lease end, between %v and %v", deadline, ok,
				before.Add(lease), entered.Add(lease))
		}
	})
}
