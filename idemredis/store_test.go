package idemredis_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemhttp/idemhttptest"
	"github.com/idemkit/idemkit/idemredis"
	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// testKeys is the tests' idemhttp.Config.FingerprintKeys.
var testKeys = [][]byte{[]byte("idemredis tests: a fingerprint secret of 32 bytes or more")}

// redisURL is the test server's URL, from IDEMKIT_TEST_REDIS_URL.
func redisURL(t testing.TB) string {
	t.Helper()
	u := os.Getenv("IDEMKIT_TEST_REDIS_URL")
	if u == "" {
		t.Fatal("IDEMKIT_TEST_REDIS_URL is not set: run scripts/test, or scripts/dev redis and source .dev/redis.env")
	}
	return u
}

func newClient(t testing.TB, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var prefixes atomic.Int64

// newStore returns a store on the test server under a prefix of its own.
func newStore(t testing.TB) *idemredis.Store {
	t.Helper()
	c := newClient(t, redisURL(t))
	s, err := idemredis.New(c, &idemredis.Config{
		Prefix: fmt.Sprintf("idemkit-test:%d:%d:", time.Now().UnixNano(), prefixes.Add(1)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The Redis store passes the Backend conformance suite.
func TestConformance(t *testing.T) {
	t.Parallel()
	idemhttptest.Run(t, func(t *testing.T) idemhttp.Backend { return newStore(t) }, idemhttptest.Options{})
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	if _, err := idemredis.New(nil, nil); !errors.Is(err, idemredis.ErrInvalidConfig) {
		t.Fatalf("New(nil) = %v, want ErrInvalidConfig", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, p := range []string{"a{b}", strings.Repeat("x", 201)} {
		if _, err := idemredis.New(c, &idemredis.Config{Prefix: p}); !errors.Is(err, idemredis.ErrInvalidConfig) {
			t.Fatalf("New(Prefix %q) = %v, want ErrInvalidConfig", p, err)
		}
	}
}

var fp = bytes.Repeat([]byte{7}, 32)

func request(key string, lease time.Duration) *idemhttp.Request {
	return &idemhttp.Request{Account: "acct-1", Operation: "POST /payments", Key: key, Fingerprint: fp,
		Lease: lease, TTL: time.Hour}
}

// A lease that ends while its holder still runs: the next request holds the
// key, and the old holder's completion (and release) is refused, so that the
// record is the new holder's.
func TestLeaseEndsWhileHolderRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	old, err := s.Reserve(ctx, request("k1", 300*time.Millisecond))
	if err != nil || old.Hold == nil {
		t.Fatalf("Reserve = %+v, %v; want a hold", old, err)
	}
	if r, err := s.Reserve(ctx, request("k1", time.Minute)); err != nil || r.Hold != nil ||
		r.State != idemhttp.StateProcessing || !bytes.Equal(r.Fingerprint, fp) {
		t.Fatalf("Reserve within the lease = %+v, %v; want PROCESSING with the holder's fingerprint", r, err)
	}
	time.Sleep(400 * time.Millisecond)
	taker, err := s.Reserve(ctx, request("k1", time.Minute))
	if err != nil || taker.Hold == nil {
		t.Fatalf("Reserve after the lease = %+v, %v; want a hold", taker, err)
	}
	if err := old.Hold.Release(ctx); err != nil {
		t.Fatalf("late Release: %v", err)
	}
	err = old.Hold.Complete(ctx, idemhttp.Response{Status: 201, Body: []byte("old")})
	if !errors.Is(err, idemhttp.ErrLeaseLost) {
		t.Fatalf("late Complete = %v, want ErrLeaseLost", err)
	}
	if r, err := s.Reserve(ctx, request("k1", time.Minute)); err != nil || r.State != idemhttp.StateProcessing {
		t.Fatalf("Reserve after the late holder = %+v, %v; want the taker's hold (PROCESSING)", r, err)
	}
	if err := taker.Hold.Complete(ctx, idemhttp.Response{Status: 201, Body: []byte("new")}); err != nil {
		t.Fatalf("taker Complete: %v", err)
	}
	r, err := s.Reserve(ctx, request("k1", time.Minute))
	if err != nil || r.State != idemhttp.StateCompleted || string(r.Response.Body) != "new" {
		t.Fatalf("Reserve after completion = %+v, %v; want the taker's record", r, err)
	}
	if ok, err := s.Forget(ctx, "acct-1", "POST /payments", "k1"); !ok || err != nil {
		t.Fatalf("Forget = %v, %v", ok, err)
	}
	if r, err := s.Reserve(ctx, request("k1", time.Minute)); err != nil || r.Hold == nil {
		t.Fatalf("Reserve after Forget = %+v, %v; want a hold", r, err)
	}
}

// A key held with NoLeaseTakeover stays held after its lease, until Forget.
func TestNoTakeoverHoldsUntilForget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	req := request("k2", 100*time.Millisecond)
	req.NoTakeover = true
	if r, err := s.Reserve(ctx, req); err != nil || r.Hold == nil {
		t.Fatalf("Reserve = %+v, %v", r, err)
	}
	time.Sleep(200 * time.Millisecond)
	if r, err := s.Reserve(ctx, req); err != nil || r.Hold != nil || r.State != idemhttp.StateProcessing {
		t.Fatalf("Reserve past the lease = %+v, %v; want still PROCESSING", r, err)
	}
	if ok, err := s.Forget(ctx, "acct-1", "POST /payments", "k2"); !ok || err != nil {
		t.Fatalf("Forget = %v, %v", ok, err)
	}
	if r, err := s.Reserve(ctx, req); err != nil || r.Hold == nil {
		t.Fatalf("Reserve after Forget = %+v, %v; want a hold", r, err)
	}
}

// redisServer is a redis-server of the test's own, on a free loopback port,
// with its append-only file synced at every write.
type redisServer struct {
	t    *testing.T
	dir  string
	port int
	cmd  *exec.Cmd
}

func startRedis(t *testing.T, dir string, port int) *redisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not installed: run scripts/dev redis (Debian's redis-server package)")
	}
	if port == 0 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
	}
	cmd := exec.Command(bin, "--bind", "127.0.0.1", "--port", fmt.Sprint(port), "--dir", dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
		"--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	s := &redisServer{t: t, dir: dir, port: port, cmd: cmd}
	t.Cleanup(s.kill)
	c := redis.NewClient(&redis.Options{Addr: s.addr()})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c.Ping(context.Background()).Err() == nil {
			return s
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("redis-server on %s does not answer:\n%s", s.addr(), log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *redisServer) addr() string { return fmt.Sprintf("127.0.0.1:%d", s.port) }

// kill SIGKILLs the server: a crash, no shutdown save.
func (s *redisServer) kill() {
	if s.cmd.Process != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
}

// Redis killed and restarted while a request is in flight: while
// it is down, requests get 503 store_unavailable and run nothing; after the
// restart the reservation it acknowledged is still there (append-only file
// synced at every write), so a duplicate gets 409, the holder completes,
// and the handler ran once.
func TestRedisRestartedWhileInFlight(t *testing.T) {
	t.Parallel()
	srv := startRedis(t, t.TempDir(), 0)
	client := redis.NewClient(&redis.Options{Addr: srv.addr(), MaxRetries: -1, DialTimeout: time.Second,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = client.Close() })
	store, err := idemredis.New(client, nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewWithBackend(store, &idemhttp.Config{
		FingerprintKeys: testKeys,
		Account:         func(*http.Request) (string, error) { return "acct-1", nil },
		Logger:          slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	started, gate := make(chan struct{}), make(chan struct{})
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open)
	var once sync.Once
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		once.Do(func() {
			close(started)
			<-gate
		})
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "paid")
	}))
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	post := func(key string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, hs.URL, strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, key)
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	done := make(chan int, 1)
	go func() {
		st, _, _ := post("k")
		done <- st
	}()
	<-started

	srv.kill()
	for _, key := range []string{"k", "other"} {
		if st, body, _ := post(key); st != http.StatusServiceUnavailable || !strings.Contains(body, idemhttp.CodeStoreUnavailable) {
			t.Fatalf("POST %s while Redis is down = %d %s; want 503 %s", key, st, body, idemhttp.CodeStoreUnavailable)
		}
	}
	startRedis(t, srv.dir, srv.port)
	if st, body, _ := post("k"); st != http.StatusConflict || !strings.Contains(body, idemhttp.CodeInFlight) {
		t.Fatalf("POST k after the restart = %d %s; want 409 (the reservation survived)", st, body)
	}
	open()
	if st := <-done; st != http.StatusCreated {
		t.Fatalf("the holder got %d after the restart, want 201", st)
	}
	st, body, hdr := post("k")
	if st != http.StatusCreated || body != "paid" || hdr.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay = %d %q %v", st, body, hdr)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler runs = %d, want 1 (the request that got 503 for key other ran nothing)", n)
	}
}

// A handler that finishes shortly after its lease, while nobody else took
// the key, keeps its record: the client's retry is a replay, the charge
// happened once.
func TestLateCompletionKept(t *testing.T) {
	t.Parallel()
	var runs atomic.Int32
	mw, err := idemhttp.NewWithBackend(newStore(t), &idemhttp.Config{
		FingerprintKeys: testKeys,
		Account:         func(*http.Request) (string, error) { return "acct-1", nil },
		Lease:           300 * time.Millisecond, TTL: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)                        // the charge
		time.Sleep(450 * time.Millisecond) // a provider call a bit slower than the lease
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	post := func() (int, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"a":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed)
	}
	s1, r1 := post()
	s2, r2 := post() // the client lost the first answer and retries
	t.Logf("first %d replayed=%q, retry %d replayed=%q", s1, r1, s2, r2)
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler runs = %d for one key, nobody else ever held it; want 1", n)
	}
}
