package idemredis_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemredis"
)

// TestWaitersShareOneSubscription: requests waiting on keys in flight
// (Config.Wait) share one pub/sub connection of the process, not one each:
// with 20 waiters on one key, the client has at most one subscribed
// connection; all are woken by the holder's completion and replay it; the
// subscription is closed with the last waiter.
func TestWaitersShareOneSubscription(t *testing.T) {
	t.Parallel()
	name := "idemredis-waiters-" + strings.ToLower(rand.Text()[:8])
	opts, err := redis.ParseURL(redisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	opts.ClientName = name
	client := redis.NewClient(opts)
	t.Cleanup(func() { _ = client.Close() })
	store, err := idemredis.New(client, &idemredis.Config{Prefix: name + ":"})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	mw, err := idemhttp.NewWithBackend(store, &idemhttp.Config{FingerprintKeys: testKeys, Wait: 30 * time.Second,
		MaxWaiters: n, MaxKeyWaiters: n, Account: func(*http.Request) (string, error) { return "acct-1", nil }})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	closeRelease := sync.OnceFunc(func() { close(release) })
	var once sync.Once
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started); <-release })
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte("done"))
	})))
	t.Cleanup(srv.Close)
	t.Cleanup(closeRelease) // before srv.Close
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	post := func() (int, string, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("{}"))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set(idemhttp.HeaderKey, "k-1")
		resp, err := hc.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		return resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), nil
	}
	go func() { _, _, _ = post() }()
	<-started
	results := make(chan string, n)
	for range n {
		go func() {
			status, replayed, err := post()
			results <- fmt.Sprintf("%d %s %v", status, replayed, err)
		}()
	}
	admin := newClient(t, redisURL(t))
	subscribed := func() int {
		list, err := admin.ClientList(context.Background()).Result()
		if err != nil {
			t.Fatal(err)
		}
		count := 0
		for _, l := range strings.Split(list, "\n") {
			if strings.Contains(l, " name="+name+" ") && (!strings.Contains(l, " sub=0 ") || !strings.Contains(l, " psub=0 ")) {
				count++
			}
		}
		return count
	}
	for deadline := time.Now().Add(15 * time.Second); store.Waiters() < n; time.Sleep(10 * time.Millisecond) {
		if c := subscribed(); c > 1 {
			t.Fatalf("%d subscribed connections for the waiters of one key, want 1", c)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests wait", store.Waiters(), n)
		}
	}
	if c := subscribed(); c != 1 {
		t.Fatalf("%d subscribed connections for %d waiters, want 1", c, n)
	}
	closeRelease()
	for range n {
		if r := <-results; r != "201 true <nil>" {
			t.Fatalf("waiter got %s, want the replay", r)
		}
	}
	if w := store.Waiters(); w != 0 {
		t.Fatalf("%d waiters left", w)
	}
	if c := subscribed(); c != 0 {
		t.Fatalf("%d subscribed connections after the last waiter", c)
	}
}
