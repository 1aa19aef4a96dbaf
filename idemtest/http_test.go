package idemtest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemtest"
	"github.com/idemkit/idemkit/migrate"
)

// TestRequireReplay: behind idemhttp's middleware, a second request with
// the key is a byte-identical replay and the handler ran once; the kit
// reports a handler that runs for every request, and a first answer that
// was not stored.
func TestRequireReplay(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := idemtest.NewSchema(t, pool)
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(pool, &idemhttp.Config{Store: store,
		FingerprintKeys: [][]byte{[]byte("idemtest: a fingerprint secret of 32 bytes or more")},
		Account:         func(r *http.Request) (string, error) { return "acct-1", nil }})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		if r.URL.Query().Get("fail") != "" {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d}`, n)
	})
	request := func(key, query string) func() *http.Request {
		return func() *http.Request {
			r := httptest.NewRequest(http.MethodPost, "/payments"+query, strings.NewReader(`{"amount":100}`))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set(idemhttp.HeaderKey, key)
			return r
		}
	}
	ctx := t.Context()

	counted, runs := idemtest.CountRuns(app)
	first, replay := idemtest.RequireReplay(ctx, t, mw.Handler(counted), request("key-1", ""), runs)
	if first.StatusCode != http.StatusCreated || replay.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("answers %d and %d %v", first.StatusCode, replay.StatusCode, replay.Header)
	}

	// Counting outside the middleware counts replays too: the kit says the
	// handler ran again (this is how a handler without the middleware, or
	// with it on the wrong route, shows).
	outside, runsOutside := idemtest.CountRuns(mw.Handler(app))
	requireReported(t, report(t, func(tb testing.TB) {
		idemtest.RequireReplay(ctx, tb, outside, request("key-2", ""), runsOutside)
	}), "the second request moved the effect from 1 to 2: the handler ran again")

	// Without the middleware there is no replay at all.
	bare, runsBare := idemtest.CountRuns(app)
	requireReported(t, report(t, func(tb testing.TB) {
		idemtest.RequireReplay(ctx, tb, bare, request("key-3", ""), runsBare)
	}), `Idempotent-Replayed ""`, "the replay's body differs")

	// A 503 is not stored: the retry runs again.
	counted, runs = idemtest.CountRuns(app)
	requireReported(t, report(t, func(tb testing.TB) {
		idemtest.RequireReplay(ctx, tb, mw.Handler(counted), request("key-4", "?fail=1"), runs)
	}), "the first answer (status 503) was not stored")

	requireReported(t, report(t, func(tb testing.TB) {
		idemtest.RequireReplay(ctx, tb, mw.Handler(counted), request("", ""), runs)
	}), "has no Idempotency-Key header")
}
