package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/migrate"
)

// 200 concurrent requests with one key make one payment; every
// other answer is 409 request_in_flight or the faithful replay.
func TestConcurrentRequestsOneEffect(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	const n = 200
	var conflicts atomic.Int32
	sawConflict := make(chan struct{})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(sawConflict) }) })
	// The first request holds its key until a concurrent request got 409,
	// so both paths are exercised (bounded, in case none ever comes).
	e.setAfter(func(r *http.Request) {
		select {
		case <-sawConflict:
		case <-time.After(10 * time.Second):
		case <-r.Context().Done():
		}
	})
	key := newKey()
	results := make([]response, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = e.tryPost(context.Background(), key, "acct-1", payment)
			if errs[i] == nil && results[i].status == http.StatusConflict {
				conflicts.Add(1)
				once.Do(func() { close(sawConflict) })
			}
		})
	}
	wg.Wait()
	wantPayments(t, e, 1)

	var first *response
	var replays, inFlight int
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		switch {
		case r.status == http.StatusCreated && !r.replayed():
			if first != nil {
				t.Fatalf("two executions: %v and %v", *first, r)
			}
			first = &results[i]
		case r.status == http.StatusCreated:
			replays++
		case r.status == http.StatusConflict && r.code() == idemhttp.CodeInFlight:
			if r.header.Get("Retry-After") != "1" {
				t.Fatalf("409 without Retry-After: 1: %v", r.header)
			}
			inFlight++
		default:
			t.Fatalf("unexpected answer %v", r)
		}
	}
	if first == nil {
		t.Fatal("no request executed")
	}
	for _, r := range results {
		if r.replayed() && (r.body != first.body || r.header.Get("Location") != first.header.Get("Location") ||
			r.header.Get("Content-Type") != first.header.Get("Content-Type")) {
			t.Fatalf("replay %v differs from the first answer %v", r, *first)
		}
	}
	if inFlight == 0 {
		t.Fatal("no request saw 409 while the first was in flight")
	}
	t.Logf("1 execution, %d replays, %d in flight", replays, inFlight)
}

// With Wait, concurrent requests wait for the first and get its replay.
func TestConcurrentRequestsWait(t *testing.T) {
	t.Parallel()
	const n = 30
	var arrived atomic.Int32
	allArrived := make(chan struct{})
	e := newEnv(t, func(c *idemhttp.Config) {
		c.Wait, c.MaxWaiters, c.MaxKeyWaiters = 30*time.Second, n, n
		c.Account = func(r *http.Request) (string, error) {
			if arrived.Add(1) == n {
				close(allArrived)
			}
			return accountFromHeader(r)
		}
	})
	// Every request is in the middleware before the first finishes.
	e.setAfter(func(r *http.Request) {
		select {
		case <-allArrived:
		case <-r.Context().Done():
		}
	})
	key := newKey()
	results := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i] = e.post(key, "acct-1", payment) })
	}
	wg.Wait()
	wantPayments(t, e, 1)
	executed := 0
	for _, r := range results {
		if r.status != http.StatusCreated {
			t.Fatalf("unexpected answer %v", r)
		}
		if !r.replayed() {
			executed++
		}
	}
	if executed != 1 {
		t.Fatalf("%d executions, want 1", executed)
	}
}

// Same key with another body is 422 and executes nothing; the
// same JSON with other key order, whitespace and number form is a replay.
func TestFingerprint(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	key := newKey()
	first := e.post(key, "acct-1", payment)
	want(t, first, http.StatusCreated, false)

	r := e.post(key, "acct-1", `{"orderId":"order-842","amount":25000,"currency":"BRL"}`)
	wantError(t, r, http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
	wantPayments(t, e, 1)

	for _, body := range []string{
		payment,
		"{\n  \"currency\": \"BRL\",\n  \"amount\": 10000,\n  \"orderId\": \"order-842\"\n}\n",
		`{"amount":1e4,"currency":"BRL","orderId":"order-842"}`,
		`{"amount":10000.00,"orderId":"order\u002d842","currency":"BRL"}`,
	} {
		r := e.post(key, "acct-1", body)
		want(t, r, http.StatusCreated, true)
		if r.body != first.body || r.header.Get("Location") != first.header.Get("Location") {
			t.Fatalf("replay %v differs from %v", r, first)
		}
	}
	wantPayments(t, e, 1)

	// Invalid JSON is refused before anything is reserved.
	r = e.post(newKey(), "acct-1", `{"orderId":"order-842",}`)
	wantError(t, r, http.StatusBadRequest, idemhttp.CodeInvalidJSON)
	wantPayments(t, e, 1)
}

// IntentJSON: only the selected members define the intent.
func TestIntentJSON(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) { c.Intent = idemhttp.IntentJSON("orderId", "/amount") })
	key := newKey()
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
	// currency does not count; amount and orderId do
	want(t, e.post(key, "acct-1", `{"orderId":"order-842","amount":10000,"currency":"USD"}`), http.StatusCreated, true)
	wantError(t, e.post(key, "acct-1", `{"orderId":"order-842","amount":10001,"currency":"BRL"}`),
		http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
	wantError(t, e.post(key, "acct-1", `{"orderId":"order-842","currency":"BRL"}`),
		http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
	wantPayments(t, e, 1)
}

// Two tenants with the same key execute independently and
// never see each other's response.
func TestTenantsAreIsolated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	key := newKey()
	a := e.post(key, "tenant-a", payment)
	b := e.post(key, "tenant-b", payment)
	want(t, a, http.StatusCreated, false)
	want(t, b, http.StatusCreated, false)
	wantPayments(t, e, 2)
	if !strings.Contains(a.body, `"account":"tenant-a"`) || !strings.Contains(b.body, `"account":"tenant-b"`) {
		t.Fatalf("responses mixed up: a=%v b=%v", a, b)
	}
	ra := e.post(key, "tenant-a", payment)
	rb := e.post(key, "tenant-b", payment)
	want(t, ra, http.StatusCreated, true)
	want(t, rb, http.StatusCreated, true)
	if ra.body != a.body || rb.body != b.body {
		t.Fatalf("replays crossed tenants: a=%v b=%v", ra, rb)
	}
	// Different body under tenant B is B's business only.
	wantError(t, e.post(key, "tenant-b", `{"orderId":"x","amount":1,"currency":"BRL"}`),
		http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
	wantPayments(t, e, 2)
}

// A panic or a 5xx releases the key and rolls back the
// handler's writes; a definitive 4xx is stored and replayed.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	t.Run("panic releases", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		key := newKey()
		e.setAfter(func(*http.Request) { panic("boom") })
		wantError(t, e.post(key, "acct-1", payment), http.StatusInternalServerError, idemhttp.CodeInternal)
		wantPayments(t, e, 0) // the insert before the panic was rolled back
		if !strings.Contains(e.logs.String(), "boom") || !strings.Contains(e.logs.String(), "goroutine") {
			t.Fatalf("panic and stack not logged: %s", e.logs.String())
		}
		e.setAfter(nil)
		want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
		want(t, e.post(key, "acct-1", payment), http.StatusCreated, true)
		wantPayments(t, e, 1)
	})
	t.Run("5xx releases", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		key := newKey()
		// The handler writes, then fails with 503.
		e.setHook(func(w http.ResponseWriter, r *http.Request) bool {
			tx, _ := idemhttp.Tx(r.Context())
			if _, err := tx.Exec(r.Context(), "INSERT INTO "+e.db.Table("payments")+
				" (account, order_id, amount) VALUES ('acct-1', 'x', 1)"); err != nil {
				t.Errorf("insert: %v", err)
			}
			http.Error(w, "gateway down", http.StatusServiceUnavailable)
			return true
		})
		r := e.post(key, "acct-1", payment)
		if r.status != http.StatusServiceUnavailable || r.replayed() || !strings.Contains(r.body, "gateway down") {
			t.Fatalf("got %v, want the handler's 503", r)
		}
		wantPayments(t, e, 0)
		e.setHook(nil)
		want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
		wantPayments(t, e, 1)
	})
	t.Run("4xx is replayed", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		key := newKey()
		var calls atomic.Int32
		e.setHook(func(w http.ResponseWriter, r *http.Request) bool {
			calls.Add(1)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusPaymentRequired)
			_, _ = w.Write([]byte(`{"error":"card declined"}`))
			return true
		})
		first := e.post(key, "acct-1", payment)
		want(t, first, http.StatusPaymentRequired, false)
		e.setHook(nil) // a replay must not reach the handler
		r := e.post(key, "acct-1", payment)
		want(t, r, http.StatusPaymentRequired, true)
		if r.body != first.body || calls.Load() != 1 {
			t.Fatalf("replay %v (handler calls %d), want %v once", r, calls.Load(), first)
		}
	})
	t.Run("429 releases", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, nil)
		key := newKey()
		e.setHook(func(w http.ResponseWriter, r *http.Request) bool {
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		})
		want(t, e.post(key, "acct-1", payment), http.StatusTooManyRequests, false)
		e.setHook(nil)
		want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
	})
}

func TestKeyAndAccountValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	wantError(t, e.post("", "acct-1", payment), http.StatusBadRequest, idemhttp.CodeKeyMissing)
	wantError(t, e.post(strings.Repeat("k", 256), "acct-1", payment), http.StatusBadRequest, idemhttp.CodeKeyInvalid)
	wantError(t, e.post(`"`, "acct-1", payment), http.StatusBadRequest, idemhttp.CodeKeyInvalid)
	wantError(t, e.post(`""`, "acct-1", payment), http.StatusBadRequest, idemhttp.CodeKeyInvalid)
	wantError(t, e.post("caf\u00e9", "acct-1", payment), http.StatusBadRequest, idemhttp.CodeKeyInvalid)
	wantError(t, e.post(newKey(), "", payment), http.StatusUnauthorized, idemhttp.CodeUnauthorized)

	// An empty header value is present but empty.
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/payments", strings.NewReader(payment))
	req.Header["Idempotency-Key"] = []string{""}
	req.Header.Set("X-Account", "acct-1")
	resp, err := e.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("empty key: status %d, want 400", resp.StatusCode)
	}
	wantPayments(t, e, 0)

	// The quoted (Structured Fields) and the bare form are one key.
	want(t, e.post(`"abc-1"`, "acct-1", payment), http.StatusCreated, false)
	want(t, e.post(`abc-1`, "acct-1", payment), http.StatusCreated, true)
	want(t, e.post(strings.Repeat("k", 255), "acct-1", payment), http.StatusCreated, false)
	wantPayments(t, e, 2)
}

func TestSizeLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) {
		c.MaxRequestBytes = 100
		c.MaxResponseBytes = 64
	})
	wantError(t, e.post(newKey(), "acct-1", `{"orderId":"`+strings.Repeat("x", 100)+`"}`),
		http.StatusRequestEntityTooLarge, idemhttp.CodeRequestTooLarge)

	key := newKey()
	var writeErr error
	e.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		tx, _ := idemhttp.Tx(r.Context())
		_, _ = tx.Exec(r.Context(), "INSERT INTO "+e.db.Table("payments")+" (account, order_id, amount) VALUES ('a', 'b', 1)")
		_, writeErr = w.Write([]byte(strings.Repeat("y", 65)))
		return true
	})
	wantError(t, e.post(key, "acct-1", payment), http.StatusInternalServerError, idemhttp.CodeResponseTooLarge)
	if !errors.Is(writeErr, idemhttp.ErrResponseTooLarge) {
		t.Fatalf("Write past the cap returned %v, want ErrResponseTooLarge", writeErr)
	}
	wantPayments(t, e, 0)
	// The key was released.
	e.setHook(func(w http.ResponseWriter, r *http.Request) bool {
		_, _ = w.Write([]byte("small"))
		return true
	})
	want(t, e.post(key, "acct-1", payment), http.StatusOK, false)
	want(t, e.post(key, "acct-1", payment), http.StatusOK, true)
}

// Responses are stored with the header allow-list only: never cookies.
func TestStoredHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	key := newKey()
	first := e.post(key, "acct-1", payment)
	if first.header.Get("Set-Cookie") == "" || first.header.Get("X-Debug") == "" {
		t.Fatalf("the first response lost the handler's headers: %v", first.header)
	}
	r := e.post(key, "acct-1", payment)
	want(t, r, http.StatusCreated, true)
	if r.header.Get("Set-Cookie") != "" || r.header.Get("X-Debug") != "" {
		t.Fatalf("replay carries headers outside the allow-list: %v", r.header)
	}
	if r.header.Get("Location") != first.header.Get("Location") || r.header.Get("Content-Type") != "application/json" {
		t.Fatalf("replay lost allow-listed headers: %v", r.header)
	}
	var stored string
	if err := e.db.Pool.QueryRow(context.Background(), "SELECT response_headers::text FROM "+
		e.db.Table("idempotency_records")).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ToLower(stored), "cookie") || strings.Contains(stored, "secret") {
		t.Fatalf("stored headers %s hold a cookie", stored)
	}

	_, err := idemhttp.New(e.db.Pool, &idemhttp.Config{Account: accountFromHeader, FingerprintKeys: testKeys,
		StoredHeaders: []string{"set-cookie"}})
	if !errors.Is(err, idemhttp.ErrInvalidConfig) {
		t.Fatalf("New with Set-Cookie allowed: %v, want ErrInvalidConfig", err)
	}
}

func TestTxIsManaged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	var commitErr, rollbackErr error
	e.setAfter(func(r *http.Request) {
		tx, ok := idemhttp.Tx(r.Context())
		if !ok {
			t.Error("no tx in the handler's context")
			return
		}
		commitErr = tx.Commit(r.Context())
		rollbackErr = tx.Rollback(r.Context())
	})
	want(t, e.post(newKey(), "acct-1", payment), http.StatusCreated, false)
	if !errors.Is(commitErr, idemhttp.ErrTxManaged) || !errors.Is(rollbackErr, idemhttp.ErrTxManaged) {
		t.Fatalf("Commit = %v, Rollback = %v, want ErrTxManaged", commitErr, rollbackErr)
	}
	wantPayments(t, e, 1)
	if _, ok := idemhttp.Tx(context.Background()); ok {
		t.Fatal("Tx outside the middleware reported true")
	}
}

func TestNoTxAndOptional(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) {
		c.NoTx = true
		c.Optional = true
	})
	e.setAfter(func(r *http.Request) {
		if _, ok := idemhttp.Tx(r.Context()); ok {
			t.Error("Tx reported a transaction with NoTx")
		}
	})
	key := newKey()
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, false)
	want(t, e.post(key, "acct-1", payment), http.StatusCreated, true)
	wantPayments(t, e, 1)
	// Without a key, Optional lets the request through unprotected.
	want(t, e.post("", "acct-1", payment), http.StatusCreated, false)
	want(t, e.post("", "acct-1", payment), http.StatusCreated, false)
	wantPayments(t, e, 3)
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	for name, cfg := range map[string]*idemhttp.Config{
		"nil":           nil,
		"no account":    {},
		"negative TTL":  {Account: accountFromHeader, FingerprintKeys: testKeys, TTL: -time.Second},
		"TTL < lease":   {Account: accountFromHeader, FingerprintKeys: testKeys, TTL: time.Second, Lease: time.Minute},
		"Cookie":        {Account: accountFromHeader, FingerprintKeys: testKeys, StoredHeaders: []string{"Cookie"}},
		"Authorization": {Account: accountFromHeader, FingerprintKeys: testKeys, StoredHeaders: []string{"authorization"}},
		"no secret":     {Account: accountFromHeader},
		"short secret":  {Account: accountFromHeader, FingerprintKeys: [][]byte{[]byte("31 bytes: too short for a key!")}},
		"short older":   {Account: accountFromHeader, FingerprintKeys: append(testKeys, []byte("short"))},
	} {
		if _, err := idemhttp.New(e.db.Pool, cfg); !errors.Is(err, idemhttp.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{IdempotencyRecords: strings.Repeat("t", 64)}}); err == nil {
		t.Error("NewStore accepted a 64-byte table name")
	}
}

func TestOperationDefault(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ method, pattern, path, want string }{
		{"POST", "POST /payments", "/payments", "POST /payments"},
		{"POST", "/payments", "/payments", "POST /payments"},
		{"POST", "POST example.com/payments/{id}", "/payments/7", "POST example.com/payments/{id}"},
		{"PATCH", "", "/orders/7", "PATCH unmatched"},
		{"BREW", "/coffee/{id}", "/coffee/7", "OTHER /coffee/{id}"},
		{"BREW", "", "/coffee/7", "OTHER unmatched"},
	} {
		r, _ := http.NewRequest(c.method, "http://example.com"+c.path, nil)
		r.Pattern = c.pattern
		if got := idemhttp.OperationDefault(r); got != c.want {
			t.Errorf("OperationDefault(%s %q) = %q, want %q", c.method, c.pattern, got, c.want)
		}
	}
}

func TestParseKey(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   []string
		want string
		err  error
	}{
		{nil, "", idemhttp.ErrKeyMissing},
		{[]string{"abc"}, "abc", nil},
		{[]string{`"abc"`}, "abc", nil},
		{[]string{`"a\"b\\c"`}, `a"b\c`, nil},
		{[]string{`"a b"`}, "a b", nil},
		{[]string{""}, "", idemhttp.ErrKeyInvalid},
		{[]string{`""`}, "", idemhttp.ErrKeyInvalid},
		{[]string{`"abc`}, "", idemhttp.ErrKeyInvalid},
		{[]string{`"abc"x`}, "", idemhttp.ErrKeyInvalid},
		{[]string{`"a\bc"`}, "", idemhttp.ErrKeyInvalid},
		{[]string{"a\x01b"}, "", idemhttp.ErrKeyInvalid},
		{[]string{"a\x7fb"}, "", idemhttp.ErrKeyInvalid},
		{[]string{"ключ"}, "", idemhttp.ErrKeyInvalid},
		{[]string{"a", "b"}, "", idemhttp.ErrKeyInvalid},
		{[]string{strings.Repeat("x", 255)}, strings.Repeat("x", 255), nil},
		{[]string{strings.Repeat("x", 256)}, "", idemhttp.ErrKeyInvalid},
	} {
		got, err := idemhttp.ParseKey(c.in)
		if got != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("ParseKey(%q) = %q, %v; want %q, %v", c.in, got, err, c.want, c.err)
		}
	}
}

// TestConfigValidate: Validate refuses what New refuses, without a pool,
// and accepts a complete configuration.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := idemhttp.Config{Account: accountFromHeader, FingerprintKeys: testKeys}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate of a complete config: %v", err)
	}
	for name, c := range map[string]idemhttp.Config{
		"no account":     {FingerprintKeys: testKeys},
		"no fingerprint": {Account: accountFromHeader},
		"short key":      {Account: accountFromHeader, FingerprintKeys: [][]byte{[]byte("short")}},
		"negative TTL":   {Account: accountFromHeader, FingerprintKeys: testKeys, TTL: -time.Second},
	} {
		if err := c.Validate(); !errors.Is(err, idemhttp.ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", name, err)
		}
	}
	var nilCfg *idemhttp.Config
	if err := nilCfg.Validate(); !errors.Is(err, idemhttp.ErrInvalidConfig) {
		t.Errorf("nil config: Validate = %v, want ErrInvalidConfig", err)
	}
}
