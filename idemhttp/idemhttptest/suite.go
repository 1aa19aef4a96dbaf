// Package idemhttptest is the conformance suite of idemhttp's Backend
// contract: the behaviour every record store must show through the
// middleware, run the same way against each (the PostgreSQL store of
// package idemhttp, the Redis store of module
// github.com/idemkit/idemkit/idemredis, or yours).
//
// Run starts a real HTTP server (httptest, on 127.0.0.1) per test, with the
// middleware on a handler whose effect is counted in memory per key, and
// checks: concurrent requests with one key run the handler once; a key
// reused with another body gets 422, also while the first request is in
// flight, in every mode (Config.NoTx, Config.NoLeaseTakeover); a duplicate of a request in flight
// gets 409 with Retry-After, or with Config.Wait the replay; a replay is
// byte-identical (status, allow-listed headers, body) and marked; a
// retryable status (5xx) releases the key; a holder whose lease ended is
// fenced out (the record is the next holder's); a holder that completes
// just after its lease while nobody took the key over either commits nothing
// (a transactional backend) or keeps its record (the others: its effect
// happened); a waiter runs when the holder releases (one of several: the
// others get its replay), and gets 409 when Wait
// ends first; a record expires after its TTL; accounts are isolated. Leases and TTLs are real time (short ones: a
// run takes a few seconds).
package idemhttptest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemkit/idemkit/idemhttp"
)

// Options describe the backend under test.
type Options struct {
	// Transactional is true when the backend's holds have a transaction
	// (the PostgreSQL store): a holder fenced out after its lease then gets
	// 409 lease_lost, its effects rolled back; without one its effects
	// happened and it gets its own response.
	Transactional bool
}

// Run runs the suite. newBackend returns a Backend on an empty store (a
// fresh schema, a fresh key prefix) for one test; it is called once per
// test, from parallel tests.
func Run(t *testing.T, newBackend func(t *testing.T) idemhttp.Backend, opts Options) {
	t.Helper()
	tests := []struct {
		name string
		f    func(t *testing.T, newBackend func(t *testing.T) idemhttp.Backend, opts Options)
	}{
		{"ConcurrentRequestsRunOnce", testConcurrent},
		{"ConcurrentRequestsWait", testConcurrentWait},
		{"ReusedKey422", testReused},
		{"InFlight409", testInFlight},
		{"ReusedKeyInFlight422", testReusedInFlight},
		{"ReplayIsIdentical", testReplay},
		{"RetryableStatusReleases", testRetryable},
		{"LeaseTakeoverIsFenced", testTakeover},
		{"LateCompletion", testLateCompletion},
		{"WaiterRunsWhenHolderReleases", testWaitRelease},
		{"WaitEndsIn409", testWaitEnds},
		{"TTLExpiry", testTTL},
		{"TenantsAreIsolated", testTenants},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.f(t, newBackend, opts)
		})
	}
}

const body = `{"orderId":"order-842","amount":10000}`

// server is a middleware over the counting handler, on a real listener.
type server struct {
	t      *testing.T
	url    string
	client *http.Client

	mu    sync.Mutex
	runs  map[string]int // by account and key
	block func(r *http.Request)
}

func newServer(t *testing.T, b idemhttp.Backend, tweak func(*idemhttp.Config)) *server {
	t.Helper()
	cfg := &idemhttp.Config{
		FingerprintKeys: [][]byte{[]byte("idemhttptest: a fingerprint secret of 32 bytes or more")},
		Account: func(r *http.Request) (string, error) {
			if a := r.Header.Get("X-Account"); a != "" {
				return a, nil
			}
			return "", fmt.Errorf("no X-Account")
		},
		Lease: 30 * time.Second,
		TTL:   time.Hour,
	}
	if tweak != nil {
		tweak(cfg)
	}
	mw, err := idemhttp.NewWithBackend(b, cfg)
	if err != nil {
		t.Fatalf("NewWithBackend: %v", err)
	}
	s := &server{t: t, runs: map[string]int{}}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(s.handle)))
	srv := httptest.NewServer(mux)
	transport := &http.Transport{MaxIdleConnsPerHost: 64}
	s.url, s.client = srv.URL, &http.Client{Transport: transport, Timeout: 30 * time.Second}
	t.Cleanup(func() {
		srv.Close()
		transport.CloseIdleConnections()
	})
	return s
}

// handle counts the run, lets the test block it, then answers 201 (or
// X-Status) with headers that are stored and some that are not, and a body
// holding every byte value.
func (s *server) handle(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	k := r.Header.Get("X-Account") + "/" + r.Header.Get(idemhttp.HeaderKey)
	s.runs[k]++
	n := s.runs[k]
	block := s.block
	s.mu.Unlock()
	if block != nil {
		block(r)
	}
	status := http.StatusCreated
	if v := r.Header.Get("X-Status"); v != "" {
		status, _ = strconv.Atoi(v)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Location", "/payments/"+strconv.Itoa(n))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Not-Stored", "1")
	w.WriteHeader(status)
	in, _ := io.ReadAll(r.Body)
	var all [256]byte
	for i := range all {
		all[i] = byte(i)
	}
	_, _ = fmt.Fprintf(w, "run %d of %s for %s\n", n, k, in)
	_, _ = w.Write(all[:])
}

func (s *server) setBlock(f func(r *http.Request)) {
	s.mu.Lock()
	s.block = f
	s.mu.Unlock()
}

func (s *server) runsOf(account, key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[account+"/"+key]
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) replayed() bool { return r.header.Get(idemhttp.HeaderReplayed) == "true" }

func (r response) code() string {
	if i := bytes.Index(r.body, []byte(`"code":"`)); i >= 0 {
		rest := r.body[i+len(`"code":"`):]
		if j := bytes.IndexByte(rest, '"'); j >= 0 {
			return string(rest[:j])
		}
	}
	return ""
}

func (r response) String() string {
	b := r.body
	if len(b) > 120 {
		b = b[:120]
	}
	return fmt.Sprintf("%d replayed=%v %q", r.status, r.replayed(), b)
}

func (s *server) post(account, key, payload string, header ...string) response {
	s.t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.url+"/payments", strings.NewReader(payload))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	req.Header.Set("X-Account", account)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatalf("POST: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatalf("read answer: %v", err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

var keys atomic.Int64

func newKey() string {
	return fmt.Sprintf("key-%d-%d", time.Now().UnixNano(), keys.Add(1))
}

func wantFirst(t *testing.T, r response) {
	t.Helper()
	if r.status != http.StatusCreated || r.replayed() {
		t.Fatalf("got %v, want a first 201", r)
	}
}

func wantReplayOf(t *testing.T, r, first response) {
	t.Helper()
	if r.status != first.status || !r.replayed() || !bytes.Equal(r.body, first.body) {
		t.Fatalf("got %v, want the replay of %v", r, first)
	}
}

func wantCode(t *testing.T, r response, status int, code string) {
	t.Helper()
	if r.status != status || r.code() != code {
		t.Fatalf("got %v, want %d %s", r, status, code)
	}
}

// gate blocks the first run of the handler until opened; started is closed
// when it is blocked.
func gate(t *testing.T, s *server) (started chan struct{}, open func()) {
	started = make(chan struct{})
	g := make(chan struct{})
	open = sync.OnceFunc(func() { close(g) })
	t.Cleanup(open)
	var once sync.Once
	s.setBlock(func(*http.Request) {
		first := false
		once.Do(func() { first = true })
		if first {
			close(started)
			<-g
		}
	})
	return started, open
}

func testConcurrent(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	s := newServer(t, nb(t), nil)
	const n = 16
	key := newKey()
	var answered atomic.Int32
	allAnswered := make(chan struct{})
	s.setBlock(func(r *http.Request) {
		select { // hold the key until every other request was answered
		case <-allAnswered:
		case <-time.After(10 * time.Second):
		case <-r.Context().Done():
		}
	})
	results := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			results[i] = s.post("acct-1", key, body)
			if answered.Add(1) == n-1 {
				close(allAnswered)
			}
		})
	}
	wg.Wait()
	firsts := 0
	for _, r := range results {
		switch {
		case r.status == http.StatusCreated && !r.replayed():
			firsts++
		case r.status == http.StatusCreated:
		case r.status == http.StatusConflict && r.code() == idemhttp.CodeInFlight:
		default:
			t.Fatalf("unexpected answer %v", r)
		}
	}
	if firsts != 1 || s.runsOf("acct-1", key) != 1 {
		t.Fatalf("%d first answers, %d handler runs; want 1 and 1", firsts, s.runsOf("acct-1", key))
	}
}

func testConcurrentWait(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	const n = 16
	s := newServer(t, nb(t), func(c *idemhttp.Config) {
		c.Wait, c.MaxWaiters, c.MaxKeyWaiters = 20*time.Second, n, n
	})
	key := newKey()
	started, open := gate(t, s)
	results := make([]response, n)
	var wg sync.WaitGroup
	wg.Go(func() { results[0] = s.post("acct-1", key, body) })
	<-started
	for i := 1; i < n; i++ {
		wg.Go(func() { results[i] = s.post("acct-1", key, body) })
	}
	time.Sleep(200 * time.Millisecond) // let the duplicates arrive and wait
	open()
	wg.Wait()
	wantFirst(t, results[0])
	for _, r := range results[1:] {
		wantReplayOf(t, r, results[0])
	}
	if got := s.runsOf("acct-1", key); got != 1 {
		t.Fatalf("handler runs = %d, want 1", got)
	}
}

func testReused(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	s := newServer(t, nb(t), nil)
	key := newKey()
	first := s.post("acct-1", key, body)
	wantFirst(t, first)
	wantCode(t, s.post("acct-1", key, `{"orderId":"order-842","amount":99}`), http.StatusUnprocessableEntity,
		idemhttp.CodeKeyReused)
	wantReplayOf(t, s.post("acct-1", key, body), first)
	if got := s.runsOf("acct-1", key); got != 1 {
		t.Fatalf("handler runs = %d, want 1", got)
	}
}

func testInFlight(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	s := newServer(t, nb(t), nil)
	key := newKey()
	started, open := gate(t, s)
	done := make(chan response, 1)
	go func() { done <- s.post("acct-1", key, body) }()
	<-started
	r := s.post("acct-1", key, body)
	wantCode(t, r, http.StatusConflict, idemhttp.CodeInFlight)
	if r.header.Get("Retry-After") == "" {
		t.Fatalf("409 without Retry-After: %v", r.header)
	}
	open()
	first := <-done
	wantFirst(t, first)
	wantReplayOf(t, s.post("acct-1", key, body), first)
}

// testReusedInFlight: another body with the key of a request in flight is
// refused with 422 at once (it can never succeed with that key), in every
// mode, not 409 (which tells the client to retry it); the holder then
// completes and is replayed.
func testReusedInFlight(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	for _, m := range []struct {
		name  string
		tweak func(*idemhttp.Config)
	}{
		{"default", nil},
		{"NoLeaseTakeover", func(c *idemhttp.Config) { c.NoLeaseTakeover = true }},
		{"NoTx", func(c *idemhttp.Config) { c.NoTx = true }},
		{"Wait", func(c *idemhttp.Config) { c.Wait = 20 * time.Second }},
	} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			s := newServer(t, nb(t), m.tweak)
			key := newKey()
			started, open := gate(t, s)
			done := make(chan response, 1)
			go func() { done <- s.post("acct-1", key, body) }()
			<-started
			wantCode(t, s.post("acct-1", key, `{"orderId":"order-842","amount":99}`), http.StatusUnprocessableEntity,
				idemhttp.CodeKeyReused)
			open()
			first := <-done
			wantFirst(t, first)
			wantReplayOf(t, s.post("acct-1", key, body), first)
			if got := s.runsOf("acct-1", key); got != 1 {
				t.Fatalf("handler runs = %d, want 1", got)
			}
		})
	}
}

func testReplay(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	s := newServer(t, nb(t), nil)
	key := newKey()
	first := s.post("acct-1", key, body)
	wantFirst(t, first)
	for range 2 {
		r := s.post("acct-1", key, body)
		wantReplayOf(t, r, first)
		for _, h := range []string{"Content-Type", "Location"} {
			if r.header.Get(h) != first.header.Get(h) {
				t.Fatalf("replayed %s = %q, want %q", h, r.header.Get(h), first.header.Get(h))
			}
		}
		for _, h := range []string{"Set-Cookie", "X-Not-Stored"} {
			if v := r.header.Get(h); v != "" {
				t.Fatalf("replay carries %s: %q; it must not be stored", h, v)
			}
		}
	}
	if !bytes.Contains(first.body, []byte{0, 1, 2}) || !bytes.HasSuffix(first.body, []byte{253, 254, 255}) {
		t.Fatalf("the handler's body lost its bytes: %v", first)
	}
}

func testRetryable(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	s := newServer(t, nb(t), nil)
	key := newKey()
	if r := s.post("acct-1", key, body, "X-Status", "503"); r.status != http.StatusServiceUnavailable || r.replayed() {
		t.Fatalf("got %v, want the handler's 503", r)
	}
	second := s.post("acct-1", key, body)
	wantFirst(t, second)
	wantReplayOf(t, s.post("acct-1", key, body), second)
	if got := s.runsOf("acct-1", key); got != 2 {
		t.Fatalf("handler runs = %d, want 2 (the 503 released the key)", got)
	}
}

func testTakeover(t *testing.T, nb func(*testing.T) idemhttp.Backend, opts Options) {
	s := newServer(t, nb(t), func(c *idemhttp.Config) { c.Lease = time.Second })
	key := newKey()
	started, open := gate(t, s) // the first run ignores its context and outlives its lease
	done := make(chan response, 1)
	go func() { done <- s.post("acct-1", key, body) }()
	<-started
	wantCode(t, s.post("acct-1", key, body), http.StatusConflict, idemhttp.CodeInFlight)
	var second response
	for deadline := time.Now().Add(15 * time.Second); ; {
		second = s.post("acct-1", key, body)
		if second.status != http.StatusConflict || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantFirst(t, second) // the lease ended: the next request holds the key
	open()
	late := <-done
	if opts.Transactional {
		wantCode(t, late, http.StatusConflict, idemhttp.CodeLeaseLost)
	} else if late.status != http.StatusCreated || late.replayed() || bytes.Equal(late.body, second.body) {
		t.Fatalf("late holder got %v, want its own 201 (its effects happened)", late)
	}
	// The record is the second holder's: the late one could not overwrite it.
	wantReplayOf(t, s.post("acct-1", key, body), second)
}

func testTTL(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	s := newServer(t, nb(t), func(c *idemhttp.Config) { c.Lease = 500 * time.Millisecond; c.TTL = time.Second })
	key := newKey()
	first := s.post("acct-1", key, body)
	wantFirst(t, first)
	wantReplayOf(t, s.post("acct-1", key, body), first)
	time.Sleep(1500 * time.Millisecond)
	// Expired: the key is unknown, even with another body.
	wantFirst(t, s.post("acct-1", key, `{"orderId":"order-843","amount":1}`))
	if got := s.runsOf("acct-1", key); got != 2 {
		t.Fatalf("handler runs = %d, want 2", got)
	}
}

func testTenants(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	s := newServer(t, nb(t), nil)
	key := newKey()
	a := s.post("acct-1", key, body)
	b := s.post("acct-2", key, body)
	wantFirst(t, a)
	wantFirst(t, b)
	wantReplayOf(t, s.post("acct-1", key, body), a)
	wantReplayOf(t, s.post("acct-2", key, body), b)
	if s.runsOf("acct-1", key) != 1 || s.runsOf("acct-2", key) != 1 {
		t.Fatalf("runs = %d and %d, want 1 each", s.runsOf("acct-1", key), s.runsOf("acct-2", key))
	}
}

func testLateCompletion(t *testing.T, nb func(*testing.T) idemhttp.Backend, opts Options) {
	s := newServer(t, nb(t), func(c *idemhttp.Config) { c.Lease = 300 * time.Millisecond })
	key := newKey()
	var once sync.Once
	s.setBlock(func(*http.Request) { once.Do(func() { time.Sleep(450 * time.Millisecond) }) }) // past the lease
	first := s.post("acct-1", key, body)
	retry := s.post("acct-1", key, body)
	if opts.Transactional {
		// Fenced at its lease end: nothing committed; the retry runs.
		wantCode(t, first, http.StatusConflict, idemhttp.CodeLeaseLost)
		wantFirst(t, retry)
		wantReplayOf(t, s.post("acct-1", key, body), retry)
		return
	}
	// Its effect happened and nobody else held the key: its record stands.
	wantFirst(t, first)
	wantReplayOf(t, retry, first)
	if got := s.runsOf("acct-1", key); got != 1 {
		t.Fatalf("handler runs = %d, want 1", got)
	}
}

func testWaitRelease(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	s := newServer(t, nb(t), func(c *idemhttp.Config) { c.Wait = 20 * time.Second })
	key := newKey()
	started, open := gate(t, s)
	first := make(chan response, 1)
	go func() { first <- s.post("acct-1", key, body, "X-Status", "503") }()
	<-started
	const waiters = 3
	second := make(chan response, waiters)
	for range waiters {
		go func() { second <- s.post("acct-1", key, body) }()
	}
	time.Sleep(200 * time.Millisecond) // let the duplicates wait
	open()
	if r := <-first; r.status != http.StatusServiceUnavailable {
		t.Fatalf("holder got %v, want its 503", r)
	}
	// The key was released: one waiter ran the handler itself, the others
	// waited for it and got its replay.
	var rs []response
	for range waiters {
		rs = append(rs, <-second)
	}
	var run response
	for _, r := range rs {
		if r.status == http.StatusCreated && !r.replayed() {
			run = r
		}
	}
	wantFirst(t, run)
	for _, r := range rs {
		if !bytes.Equal(r.body, run.body) {
			t.Fatalf("waiter got %v, want the run %v or its replay", r, run)
		}
	}
	wantReplayOf(t, s.post("acct-1", key, body), run)
	if got := s.runsOf("acct-1", key); got != 2 {
		t.Fatalf("handler runs = %d, want 2", got)
	}
}

func testWaitEnds(t *testing.T, nb func(*testing.T) idemhttp.Backend, _ Options) {
	s := newServer(t, nb(t), func(c *idemhttp.Config) { c.Wait = 300 * time.Millisecond })
	key := newKey()
	started, open := gate(t, s)
	first := make(chan response, 1)
	go func() { first <- s.post("acct-1", key, body) }()
	<-started
	begin := time.Now()
	wantCode(t, s.post("acct-1", key, body), http.StatusConflict, idemhttp.CodeInFlight)
	if waited := time.Since(begin); waited < 250*time.Millisecond {
		t.Fatalf("answered 409 after %v, before Wait (300ms) ended", waited)
	}
	open()
	f := <-first
	wantFirst(t, f)
	wantReplayOf(t, s.post("acct-1", key, body), f)
}
