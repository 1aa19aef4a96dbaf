package idemhttp_test

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
)

type ctxMark struct{}

// TestObserve: Config.Observe reports each request once, after its answer,
// with its scope, outcome and status, and the request's context.
func TestObserve(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var events []idemhttp.Event
	var marks []string
	e := newEnv(t, func(c *idemhttp.Config) {
		c.Observe = func(ctx context.Context, ev idemhttp.Event) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, ev)
			m, _ := ctx.Value(ctxMark{}).(string)
			marks = append(marks, m)
		}
	})
	// A tracing middleware in front puts its span in the request's context.
	inner := e.srv.Config.Handler
	e.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inner.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxMark{}, "front")))
	})
	key := newKey()
	payment := `{"orderId":"o-1","amount":100,"currency":"EUR"}`
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, true)
	if r := e.post(key, "acct-1", `{"orderId":"o-2","amount":100,"currency":"EUR"}`); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("reuse with another body: %v", r)
	}
	if r := e.post("", "acct-1", payment); r.status != http.StatusBadRequest {
		t.Fatalf("no key: %v", r)
	}
	failKey := newKey()
	e.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusBadGateway) // a retryable failure: the key is released
		return true
	})
	if r := e.post(failKey, "acct-1", payment); r.status != http.StatusBadGateway {
		t.Fatalf("failing handler: %v", r)
	}
	e.setHook(nil)

	mu.Lock()
	defer mu.Unlock()
	type brief struct {
		outcome idemhttp.Outcome
		status  int
		key     string
	}
	var got []brief
	for _, ev := range events {
		got = append(got, brief{ev.Outcome, ev.Status, ev.Key})
		if ev.Duration <= 0 {
			t.Errorf("event %+v without a duration", ev)
		}
		if ev.Key != "" && (ev.Account != "acct-1" || ev.Operation == "") {
			t.Errorf("event %+v: want account acct-1 and an operation", ev)
		}
	}
	wantEvents := []brief{
		{idemhttp.OutcomeFirst, http.StatusCreated, key},
		{idemhttp.OutcomeReplay, http.StatusCreated, key},
		{idemhttp.OutcomeMismatch, http.StatusUnprocessableEntity, key},
		{idemhttp.OutcomeInvalid, http.StatusBadRequest, ""},
		{idemhttp.OutcomeReleased, http.StatusBadGateway, failKey},
	}
	if !slices.Equal(got, wantEvents) {
		t.Fatalf("events %+v, want %+v", got, wantEvents)
	}
	for i, m := range marks {
		if m != "front" {
			t.Fatalf("event %d got a context without the front middleware's value", i)
		}
	}
}
