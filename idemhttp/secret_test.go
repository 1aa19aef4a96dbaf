package idemhttp_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
)

// unkeyedFingerprint is what anyone who reads the source can compute from a
// guessed request: the fingerprint's input, hashed without a secret.
func unkeyedFingerprint(operation, method, path string, query, mediaType, body []byte) []byte {
	var b bytes.Buffer
	field := func(p []byte) {
		var n [binary.MaxVarintLen64]byte
		b.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		b.Write(p)
	}
	b.WriteString("idemhttp/2\n")
	field([]byte(operation))
	field([]byte(method))
	field([]byte(path))
	var intent bytes.Buffer
	for _, f := range [][]byte{query, mediaType, body} {
		var n [binary.MaxVarintLen64]byte
		intent.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
		intent.Write(f)
	}
	field(intent.Bytes())
	sum := sha256.Sum256(b.Bytes())
	return sum[:]
}

// TestFingerprintIsKeyed: the stored fingerprint of a request whose body
// holds a low-entropy secret (a card's middle digits) cannot be checked
// against guesses offline by someone who reads the table but not the
// server's secret: it is not the plain hash of the request's canonical form.
func TestFingerprintIsKeyed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := newKey()
	body := `{"amount":10000,"currency":"BRL","orderId":"4111111111111111"}`
	want(t, e.post(key, "acct-1", body), http.StatusCreated, false)
	rec, err := e.store.Get(context.Background(), e.db.Pool, "acct-1", "POST /payments", key)
	if err != nil {
		t.Fatal(err)
	}
	guess := unkeyedFingerprint("POST /payments", "POST", "/payments", nil, []byte("application/json"), []byte(body))
	if bytes.Equal(rec.Fingerprint, guess) {
		t.Fatalf("the stored fingerprint %x is the unkeyed SHA-256 of the request: guessable offline", rec.Fingerprint)
	}
	if len(rec.Fingerprint) != sha256.Size {
		t.Fatalf("fingerprint of %d bytes", len(rec.Fingerprint))
	}
}

// TestFingerprintKeyRotation: a process whose FingerprintKeys lists the new
// secret first and the old one after still recognises the requests of
// records, and of requests in flight, keyed with the old secret: it replays
// them, answers 409 to a duplicate in flight, and 422 to another body. A
// process that no longer knows the old secret answers 422.
func TestFingerprintKeyRotation(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode func(*idemhttp.Config)) {
		e := newEnv(t, mode) // keyed with testKeys
		newKey2 := []byte("the next fingerprint secret, 32 bytes or more")
		server := func(keys ...[]byte) string {
			cfg := &idemhttp.Config{Store: e.store, Account: accountFromHeader, FingerprintKeys: keys}
			mode(cfg)
			mw, err := idemhttp.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(e.createPayment)))
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			return srv.URL + "/payments"
		}
		rotated := server(newKey2, testKeys[0])
		dropped := server(newKey2)
		post := func(url, key, body string) response {
			t.Helper()
			r, err := postTo(context.Background(), e.client, url, key, "acct-1", body)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		other := `{"orderId":"order-843","amount":1,"currency":"BRL"}`

		key := newKey()
		first := e.post(key, "acct-1", payment)
		want(t, first, http.StatusCreated, false)
		if r := post(rotated, key, payment); r.status != first.status || !r.replayed() || r.body != first.body {
			t.Fatalf("rotated: %v, want the replay of %v", r, first)
		}
		wantError(t, post(rotated, key, other), http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
		wantError(t, post(dropped, key, payment), http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)

		// In flight under the old secret.
		key = newKey()
		started, release := make(chan struct{}), make(chan struct{})
		closeRelease := sync.OnceFunc(func() { close(release) })
		t.Cleanup(closeRelease)
		var once sync.Once
		e.setHook(func(http.ResponseWriter, *http.Request) bool {
			once.Do(func() { close(started); <-release })
			return false
		})
		done := make(chan response, 1)
		go func() { done <- e.post(key, "acct-1", payment) }()
		<-started
		wantError(t, post(rotated, key, payment), http.StatusConflict, idemhttp.CodeInFlight)
		wantError(t, post(rotated, key, other), http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
		closeRelease()
		want(t, <-done, http.StatusCreated, false)
		wantPayments(t, e, 2)
	})
}

// TestReplayRefiltersHeaders: a replay sends only the stored headers that
// the middleware's allow-list names now: a record stored while another
// allow-list was in force (or written to the table by anything else) does
// not replay a header the operator has since taken off the list.
func TestReplayRefiltersHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *idemhttp.Config) {
		c.StoredHeaders = append([]string{"X-Debug"}, idemhttp.StoredHeadersDefault...)
	})
	key := newKey()
	first := e.post(key, "acct-1", payment)
	want(t, first, http.StatusCreated, false)
	if r := e.post(key, "acct-1", payment); r.header.Get("X-Debug") == "" {
		t.Fatalf("the allow-listed X-Debug was not replayed: %v", r.header)
	}
	cfg := &idemhttp.Config{Store: e.store, Account: accountFromHeader, FingerprintKeys: testKeys}
	mw, err := idemhttp.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(e.createPayment)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	r, err := postTo(context.Background(), e.client, srv.URL+"/payments", key, "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	want(t, r, http.StatusCreated, true)
	if v := r.header.Get("X-Debug"); v != "" {
		t.Fatalf("replay carries X-Debug %q, which the allow-list no longer names", v)
	}
	if r.header.Get("Location") != first.header.Get("Location") {
		t.Fatalf("replayed Location %q, want %q", r.header.Get("Location"), first.header.Get("Location"))
	}
}
