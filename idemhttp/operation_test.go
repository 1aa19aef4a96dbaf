package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
)

// TestOperationWithNUL: behind a router that sets no pattern, the default
// Operation is the method and the URL path, which a client controls:
// "/payments%00x" decodes to a path with NUL, "/payments%ff" to invalid
// UTF-8, and a path may be longer than the records' primary key holds. Such
// an operation is the client's bad input, answered 400 operation_invalid
// before anything is stored or run, not a store outage (it was 503
// store_unavailable, logged as an ERROR, SQLSTATE 22021). A storable path
// behind the same router still goes through.
func TestOperationWithNUL(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	srv := httptest.NewServer(e.mw.Handler(http.HandlerFunc(e.createPayment)))
	t.Cleanup(srv.Close)
	post := func(t *testing.T, path, key string) response {
		t.Helper()
		req, err := http.NewRequest("POST", srv.URL+path, strings.NewReader(`{"orderId":"o1","amount":1}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Account", "acct")
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return response{status: res.StatusCode, header: res.Header, body: string(body)}
	}
	for i, path := range []string{"/payments%00x", "/payments%ff", "/payments/" + strings.Repeat("x", 3000)} {
		r := post(t, path, "k-bad-"+string(rune('a'+i)))
		t.Logf("%.40s: %d %s", path, r.status, r.body)
		wantError(t, r, http.StatusBadRequest, idemhttp.CodeOperationInvalid)
	}
	if logs := e.logs.String(); strings.Contains(logs, "level=ERROR") {
		t.Fatalf("a client's path logged as an error:\n%s", logs)
	}
	wantPayments(t, e, 0)

	// The same request on a storable path runs, and is replayed.
	path := "/payments/" + strings.Repeat("é", 400) // 810 bytes: under MaxOperationLength
	first := post(t, path, "k-good")
	if first.status >= 300 || first.replayed() {
		t.Fatalf("POST on a storable path: %v", first)
	}
	if again := post(t, path, "k-good"); again.status != first.status || !again.replayed() {
		t.Fatalf("retry on a storable path: %v, want a replay of %v", again, first)
	}
	wantPayments(t, e, 1)
}

// TestOperationCustomInvalid: an Operation function of the user's returning
// text that cannot be stored gets the same 400, not a store failure.
func TestOperationCustomInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) {
		c.Operation = func(r *http.Request) string { return "create\x00payment" }
	})
	wantError(t, e.post("k-1", "acct-1", payment), http.StatusBadRequest, idemhttp.CodeOperationInvalid)
	wantPayments(t, e, 0)
}
