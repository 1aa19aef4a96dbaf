package idemhttp_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
)

// TestCaseVariantMembers: {"amount":100,"Amount":999} and its reverse mean
// different things to a handler decoding with encoding/json (which matches
// member names case-insensitively and keeps the last), so they must not
// share a fingerprint: such a body is refused with 400 invalid_json, and
// nothing runs.
func TestCaseVariantMembers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, body := range []string{
		`{"orderId":"o-1","amount":100,"Amount":999,"currency":"BRL"}`,
		`{"orderId":"o-1","Amount":999,"amount":100,"currency":"BRL"}`,
		`{"orderId":"o-1","amount":100,"currency":"BRL","ORDERID":"o-2"}`,
	} {
		wantError(t, e.post(newKey(), "acct-1", body), http.StatusBadRequest, idemhttp.CodeInvalidJSON)
	}
	wantPayments(t, e, 0)
	for _, in := range []string{`{"amount":1,"Amount":2}`, `{"a":{"K":1,"k":2}}`, `[{"ſ":1,"S":1}]`, `{"K":1,"k":2}`} {
		if _, err := idemhttp.CanonicalJSON([]byte(in)); err == nil {
			t.Errorf("CanonicalJSON(%s) accepted members equal under encoding/json's case folding", in)
		}
	}
}

// TestMediaTypeInIntent: the same bytes sent as application/json and as
// text/plain are two requests (the handler may read them differently): the
// second answers 422.
func TestMediaTypeInIntent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(r.Header.Get("Content-Type")))
		return true
	})
	key := newKey()
	body := `{"amount":1}`
	post := func(ct string) response {
		t.Helper()
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, e.srv.URL+"/payments",
			strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", ct)
		req.Header.Set(idemhttp.HeaderKey, key)
		req.Header.Set("X-Account", "acct-1")
		r, err := do(e.client, req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	want(t, post("application/json"), http.StatusAccepted, false)
	want(t, post("Application/JSON"), http.StatusAccepted, true) // the same media type
	wantError(t, post("text/plain"), http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
}

// TestQueryThatDoesNotParse: a query url.ParseQuery cannot read whole
// ("?to=alice;", which it drops, so that "?to=alice;" and "?to=mallory;"
// would both count as no query) is refused with 400 invalid_request.
func TestQueryThatDoesNotParse(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, q := range []string{"to=alice;", "to=%zz", "a=1;b=2"} {
		r, err := postTo(context.Background(), e.client, e.srv.URL+"/payments?"+q, newKey(), "acct-1", payment)
		if err != nil {
			t.Fatal(err)
		}
		wantError(t, r, http.StatusBadRequest, idemhttp.CodeInvalidRequest)
	}
	wantPayments(t, e, 0)
	// A query that parses still counts by its pairs, in any order.
	key := newKey()
	r, err := postTo(context.Background(), e.client, e.srv.URL+"/payments?b=2&a=1", key, "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	want(t, r, http.StatusCreated, false)
	if r, err = postTo(context.Background(), e.client, e.srv.URL+"/payments?a=1&b=2", key, "acct-1", payment); err != nil {
		t.Fatal(err)
	}
	want(t, r, http.StatusCreated, true)
}
