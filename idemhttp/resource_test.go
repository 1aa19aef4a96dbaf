package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
)

// refundServer serves POST /payments/{id}/refunds through e's middleware and
// counts the handler's runs.
func refundServer(t *testing.T, e *env, pattern bool) (url string, runs *atomic.Int32) {
	t.Helper()
	runs = &atomic.Int32{}
	h := e.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		id := r.PathValue("id")
		if id == "" {
			id = strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/payments/"), "/refunds")
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"refunded_payment":%q}`, id)
	}))
	var srv *httptest.Server
	if pattern {
		mux := http.NewServeMux()
		mux.Handle("POST /payments/{id}/refunds", h)
		srv = httptest.NewServer(mux)
	} else {
		srv = httptest.NewServer(h) // a router that sets no pattern
	}
	t.Cleanup(srv.Close)
	return srv.URL, runs
}

// TestSameKeyOtherResource: the same Idempotency-Key and body on two
// resources of one route (POST /payments/1/refunds, then
// /payments/2/refunds) are two different requests: the second is refused
// with 422, never answered with the first one's stored response while its
// own refund never runs. With a ServeMux pattern and without one.
func TestSameKeyOtherResource(t *testing.T) {
	t.Parallel()
	for _, pattern := range []bool{true, false} {
		t.Run(fmt.Sprintf("pattern=%v", pattern), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			url, runs := refundServer(t, e, pattern)
			key := newKey()
			const refund = `{"amount":500}`
			first, err := postTo(context.Background(), e.client, url+"/payments/1/refunds", key, "acct-1", refund)
			if err != nil {
				t.Fatal(err)
			}
			want(t, first, http.StatusCreated, false)
			second, err := postTo(context.Background(), e.client, url+"/payments/2/refunds", key, "acct-1", refund)
			if err != nil {
				t.Fatal(err)
			}
			wantError(t, second, http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
			again, err := postTo(context.Background(), e.client, url+"/payments/1/refunds", key, "acct-1", refund)
			if err != nil {
				t.Fatal(err)
			}
			want(t, again, http.StatusCreated, true)
			if again.body != first.body {
				t.Fatalf("replay %q, want %q", again.body, first.body)
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("handler runs = %d, want 1", n)
			}
		})
	}
}

// TestOperationBounded: behind a router that sets no pattern, requests to
// many paths and with made-up methods give one operation per standard
// method (the Event's Operation, the metrics' label), not one per path
// or method a client invents.
func TestOperationBounded(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	ops := map[string]bool{}
	e := newEnv(t, func(c *idemhttp.Config) {
		c.Observe = func(_ context.Context, ev idemhttp.Event) {
			mu.Lock()
			ops[ev.Operation] = true
			mu.Unlock()
		}
	})
	url, _ := refundServer(t, e, false)
	for i := range 30 {
		method := "POST"
		if i%3 == 0 {
			method = fmt.Sprintf("X%d", i)
		}
		req, err := http.NewRequest(method, fmt.Sprintf("%s/orders/%d/refunds", url, i), strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(idemhttp.HeaderKey, newKey())
		req.Header.Set("X-Account", "acct-1")
		if _, err := do(e.client, req); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(ops) > 2 {
		t.Fatalf("%d distinct operations from 30 requests, want at most 2: %v", len(ops), ops)
	}
}
