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
// Operation is the method and "unmatched": the URL path, which a client
// controls ("/payments%00x" decodes to a path with NUL, "/payments%ff" to
// invalid UTF-8, and a path may be longer than the records' primary key
// holds), is only hashed into the fingerprint, never stored. Such requests
// run, are replayed, and no ERROR is logged.
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
	for i, path := range []string{"/payments%00x", "/payments%ff", "/payments/" + strings.Repeat("x", 3000),
		"/payments/" + strings.Repeat("é", 400)} {
		key := "k-" + string(rune('a'+i))
		first := post(t, path, key)
		if first.status != http.StatusCreated || first.replayed() {
			t.Fatalf("POST %.40s: %v", path, first)
		}
		if again := post(t, path, key); again.status != first.status || !again.replayed() || again.body != first.body {
			t.Fatalf("retry of %.40s: %v, want a replay of %v", path, again, first)
		}
	}
	if logs := e.logs.String(); strings.Contains(logs, "level=ERROR") {
		t.Fatalf("a client's path logged as an error:\n%s", logs)
	}
	wantPayments(t, e, 4)
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
