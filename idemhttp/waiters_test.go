package idemhttp_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
)

// TestWaitersOffThePool: with Wait, duplicates of a request in flight wait
// without taking the pool's connections, at most MaxKeyWaiters of them on a
// key (the others get 409 at once): another account's request still runs
// on a pool of 3 connections while 6 duplicates of a held key arrive; once
// the holder completes, the waiters replay its response.
func TestWaitersOffThePool(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	app := "idemhttp-waiters-" + strings.ToLower(rand.Text()[:8])
	pcfg := e.db.Pool.Config().Copy()
	pcfg.MaxConns = 3
	pcfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	mw, err := idemhttp.New(pool, &idemhttp.Config{Store: e.store, Account: accountFromHeader,
		FingerprintKeys: testKeys, Wait: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(e.createPayment)))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	url := srv.URL + "/payments"

	key := newKey()
	started, release := make(chan struct{}), make(chan struct{})
	closeRelease := sync.OnceFunc(func() { close(release) })
	t.Cleanup(closeRelease)
	var once sync.Once
	e.setHook(func(_ http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-Account") == "acct-1" {
			once.Do(func() { close(started); <-release })
		}
		return false
	})
	first := make(chan response, 1)
	go func() {
		r, _ := postTo(context.Background(), e.client, url, key, "acct-1", payment)
		first <- r
	}()
	<-started

	const dups = 6
	var (
		mu      sync.Mutex
		results []response
		wg      sync.WaitGroup
	)
	for range dups {
		wg.Go(func() {
			r, err := postTo(context.Background(), e.client, url, key, "acct-1", payment)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			results = append(results, r)
			mu.Unlock()
		})
	}
	// Every duplicate is either answered or waits in PostgreSQL on a lock.
	var waiting, answered int
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := e.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_catalog.pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		answered = len(results)
		mu.Unlock()
		if waiting+answered == dups {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d duplicates wait on a lock and %d are answered: the others wait for a pooled connection",
				waiting, dups, answered)
		}
	}
	// Another account's request gets a pooled connection and runs.
	other, err := postTo(context.Background(), e.client, url, newKey(), "acct-2", payment)
	if err != nil {
		t.Fatal(err)
	}
	want(t, other, http.StatusCreated, false)

	closeRelease()
	want(t, <-first, http.StatusCreated, false)
	wg.Wait()
	conflicts := 0
	for _, r := range results {
		switch {
		case r.status == http.StatusConflict && r.code() == idemhttp.CodeInFlight:
			conflicts++
		case r.status == http.StatusCreated && r.replayed():
		default:
			t.Fatalf("duplicate answered %v", r)
		}
	}
	if conflicts != dups-idemhttp.MaxKeyWaitersDefault {
		t.Fatalf("%d duplicates got 409, want %d (past MaxKeyWaiters %d)", conflicts, dups-idemhttp.MaxKeyWaitersDefault,
			idemhttp.MaxKeyWaitersDefault)
	}
	wantPayments(t, e, 2)
}

// blockingBackend answers every request as in flight; a request allowed
// to wait (Wait > 0) first blocks until the test lets it go.
type blockingBackend struct {
	entered chan string
	release chan struct{}
}

func (b *blockingBackend) Reserve(ctx context.Context, req *idemhttp.Request) (idemhttp.Reservation, error) {
	if req.Wait > 0 {
		b.entered <- req.Key
		select {
		case <-b.release:
		case <-ctx.Done():
		}
	}
	return idemhttp.Reservation{State: idemhttp.StateProcessing}, nil
}

// TestMaxWaiters: past Config.MaxWaiters requests waiting at once on all
// keys, the next request does not wait: the backend is asked without Wait
// and the client gets 409 at once.
func TestMaxWaiters(t *testing.T) {
	t.Parallel()
	b := &blockingBackend{entered: make(chan string), release: make(chan struct{})}
	mw, err := idemhttp.NewWithBackend(b, &idemhttp.Config{FingerprintKeys: testKeys, Account: accountFromHeader,
		Wait: time.Minute, MaxWaiters: 2})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Error("handler ran")
	})))
	t.Cleanup(srv.Close)
	client := newClient(t)
	results := make(chan response, 2)
	for _, key := range []string{"k-1", "k-2"} {
		go func() {
			r, _ := postTo(context.Background(), client, srv.URL, key, "acct-1", payment)
			results <- r
		}()
		<-b.entered // waiting
	}
	r, err := postTo(context.Background(), client, srv.URL, "k-3", "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, r, http.StatusConflict, idemhttp.CodeInFlight)
	close(b.release)
	for range 2 {
		wantError(t, <-results, http.StatusConflict, idemhttp.CodeInFlight)
	}
}

// TestAcquireBounded: a request that cannot get a pooled connection (the
// pool is exhausted) is answered 503 store_unavailable after a bounded
// wait, not queued for as long as the pool stays full.
func TestAcquireBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pcfg := e.db.Pool.Config().Copy()
	pcfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	mw, err := idemhttp.New(pool, &idemhttp.Config{Store: e.store, Account: accountFromHeader, FingerprintKeys: testKeys})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(e.createPayment)))
	t.Cleanup(srv.Close)
	conn, err := pool.Acquire(context.Background()) // the pool's only connection
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := postTo(ctx, e.client, srv.URL, newKey(), "acct-1", payment)
	if err != nil {
		t.Fatalf("no answer while the pool is exhausted: %v", err)
	}
	wantError(t, r, http.StatusServiceUnavailable, idemhttp.CodeStoreUnavailable)
}
