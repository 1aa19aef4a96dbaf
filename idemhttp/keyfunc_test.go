package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
)

func TestKeyFromHeader(t *testing.T) {
	t.Parallel()
	key := idemhttp.KeyFromHeader("x-github-delivery")
	for _, c := range []struct {
		name   string
		values []string
		want   string
		err    error
	}{
		{"present", []string{"72d3162e-cc78-11e3-81ab-4c9367dc0958"}, "72d3162e-cc78-11e3-81ab-4c9367dc0958", nil},
		{"spaces trimmed", []string{" d-1 "}, "d-1", nil},
		{"missing", nil, "", idemhttp.ErrKeyMissing},
		{"twice", []string{"a", "b"}, "", idemhttp.ErrKeyInvalid},
		{"empty", []string{""}, "", idemhttp.ErrKeyInvalid},
		{"not ASCII", []string{"caf\u00e9"}, "", idemhttp.ErrKeyInvalid},
		{"too long", []string{strings.Repeat("k", idemhttp.MaxKeyLength+1)}, "", idemhttp.ErrKeyInvalid},
	} {
		r := httptest.NewRequest(http.MethodPost, "/hooks", nil)
		r.Header["X-Github-Delivery"] = c.values
		got, err := key(r, nil)
		if got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("%s: got %q, %v; want %q, %v", c.name, got, err, c.want, c.err)
		}
		if err != nil && !strings.Contains(err.Error(), "X-Github-Delivery") {
			t.Errorf("%s: the error %q does not name the header", c.name, err)
		}
	}
}

func TestKeyFromJSON(t *testing.T) {
	t.Parallel()
	r := httptest.NewRequest(http.MethodPost, "/hooks", nil)
	for _, c := range []struct {
		member, body string
		want         string
		err          error
	}{
		{"id", `{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event"}`, "evt_1NG8Du2eZvKYlo2CUI79vXWy", nil},
		{"/id", ` { "object" : "event", "id" : "evt\u005f1" } `, "evt_1", nil},
		{"/data/object/id", `{"data":{"object":{"id":"pi_1"}}}`, "pi_1", nil},
		{"a/b", `{"a/b":"k"}`, "k", nil},
		{"id", `{"object":"event"}`, "", idemhttp.ErrKeyMissing},
		{"/data/object/id", `{"data":{}}`, "", idemhttp.ErrKeyMissing},
		{"id", `{"id":42}`, "", idemhttp.ErrKeyInvalid},
		{"id", `{"id":null}`, "", idemhttp.ErrKeyInvalid},
		{"id", `{"id":{"value":"x"}}`, "", idemhttp.ErrKeyInvalid},
		{"id", `{"id":""}`, "", idemhttp.ErrKeyInvalid},
		{"id", `{"id":"caf\u00e9"}`, "", idemhttp.ErrKeyInvalid},
		{"id", `{"id":"a","id":"b"}`, "", idemhttp.ErrInvalidJSON},
		{"id", `id=evt_1`, "", idemhttp.ErrInvalidJSON},
		{"id", ``, "", idemhttp.ErrInvalidJSON},
	} {
		got, err := idemhttp.KeyFromJSON(c.member)(r, []byte(c.body))
		if got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("KeyFromJSON(%q) of %s: got %q, %v; want %q, %v", c.member, c.body, got, err, c.want, c.err)
		}
	}
	// The error says what is wrong without quoting the value.
	_, err := idemhttp.KeyFromJSON("id")(r, []byte(`{"id":12345678}`))
	if err == nil || strings.Contains(err.Error(), "12345678") || !strings.Contains(err.Error(), "a number") {
		t.Fatalf("error %q", err)
	}
}

// FuzzKeyFromJSON: whatever the body, KeyFromJSON does not panic, and a key
// it returns is printable ASCII and the string encoding/json finds at the
// member.
func FuzzKeyFromJSON(f *testing.F) {
	for _, s := range []string{`{"id":"evt_1"}`, `{"id":1}`, `{"ID":"a","id":"b"}`, `{"id":"\u0041"}`, `[]`, `"id"`,
		`{"id":"a\"b"}`, `{"data":{"id":"x"},"id":"y"}`} {
		f.Add([]byte(s))
	}
	r := httptest.NewRequest(http.MethodPost, "/hooks", nil)
	key := idemhttp.KeyFromJSON("id")
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := key(r, body)
		if err != nil {
			if got != "" {
				t.Fatalf("key %q with error %v", got, err)
			}
			return
		}
		if got == "" || len(got) > idemhttp.MaxKeyLength {
			t.Fatalf("key of %d bytes", len(got))
		}
		for i := 0; i < len(got); i++ {
			if got[i] < 0x20 || got[i] > 0x7e {
				t.Fatalf("key %q has byte 0x%02x", got, got[i])
			}
		}
		var ref map[string]json.RawMessage
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", body, err)
		}
		var want string
		if err := json.Unmarshal(ref["id"], &want); err != nil || want != got {
			t.Fatalf("key %q, encoding/json finds %q (%v) in %q", got, want, err, body)
		}
	})
}

// TestConfigKey: with Config.Key the key comes from the body, the handler
// still reads the whole body, and the rest of the contract holds: 422 for
// another body under the key, 400 for a missing or non-string key, 413 past
// the limit with nothing stored.
func TestConfigKey(t *testing.T) {
	t.Parallel()
	const limit = 200
	e := newEnv(t, func(c *idemhttp.Config) {
		c.Key = idemhttp.KeyFromJSON("orderId")
		c.MaxRequestBytes = limit
	})
	first := `{"orderId":"order-1","amount":100,"currency":"EUR"}`
	want(t, e.post("", "acct-1", first), http.StatusCreated, false)
	r := e.post("", "acct-1", `{"currency":"EUR","amount":1e2,"orderId":"order-1"}`)
	want(t, r, http.StatusCreated, true)
	var p paymentResponse
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.OrderID != "order-1" || p.Amount != 100 {
		t.Fatalf("the handler did not read the whole body: %v (%v)", r, err)
	}
	// The Idempotency-Key header does not count when Key is set.
	want(t, e.post(newKey(), "acct-1", first), http.StatusCreated, true)
	wantError(t, e.post("", "acct-1", `{"orderId":"order-1","amount":999,"currency":"EUR"}`),
		http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
	// Another account is another scope.
	want(t, e.post("", "acct-2", first), http.StatusCreated, false)
	wantPayments(t, e, 2)

	r = e.post("", "acct-1", `{"amount":100,"currency":"EUR"}`)
	wantError(t, r, http.StatusBadRequest, idemhttp.CodeKeyMissing)
	if !strings.Contains(r.body, "orderId") {
		t.Fatalf("the message does not name the member: %v", r)
	}
	wantError(t, e.post("", "acct-1", `{"orderId":7,"amount":100}`), http.StatusBadRequest, idemhttp.CodeKeyInvalid)
	wantError(t, e.post("", "acct-1", `{"orderId":"order-2",`), http.StatusBadRequest, idemhttp.CodeInvalidJSON)

	// A body of exactly the limit is read; one byte more is refused before
	// anything is reserved.
	pad := func(n int) string {
		b := `{"orderId":"order-3","amount":5,"currency":"EUR","pad":""}`
		return strings.Replace(b, `"pad":""`, `"pad":"`+strings.Repeat("x", n-len(b))+`"`, 1)
	}
	wantError(t, e.post("", "acct-1", pad(limit+1)), http.StatusRequestEntityTooLarge, idemhttp.CodeRequestTooLarge)
	if n := e.records(); n != 2 {
		t.Fatalf("%d records after the refused body, want 2", n)
	}
	want(t, e.post("", "acct-1", pad(limit)), http.StatusCreated, false)
	wantPayments(t, e, 3)
}

// TestConfigKeyOptional: with Optional, a request whose KeyFunc finds no key
// reaches the handler with its body.
func TestConfigKeyOptional(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) {
		c.Key = idemhttp.KeyFromHeader("X-Request-Id")
		c.Optional = true
	})
	want(t, e.post("", "acct-1", payment), http.StatusCreated, false)
	want(t, e.post("", "acct-1", payment), http.StatusCreated, false)
	wantPayments(t, e, 2)
}

// records counts the idempotency records of the test's schema.
func (e *env) records() int {
	e.t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.db.Table("idempotency_records")).Scan(&n); err != nil {
		e.t.Fatalf("count records: %v", err)
	}
	return n
}
