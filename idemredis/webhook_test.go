package idemredis_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"crypto/hmac"
	"crypto/sha256"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemredis"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/webhook"
)

// TestWebhookReceiver: a webhook receiver whose records live in Redis
// applies 1,000 concurrent copies of a Stripe delivery once, answers
// duplicates from the record and another body under the ID with 422, and
// leaves nothing in Redis for a delivery it refuses (a bad signature, an
// old timestamp, a body one byte too long).
func TestWebhookReceiver(t *testing.T) {
	t.Parallel()
	const (
		secret = "whsec_redis0receiver0signing0secret"
		copies = 1000
		limit  = 1024
	)
	ctx := context.Background()
	client := newClient(t, redisURL(t))
	prefix := fmt.Sprintf("idemkit-test:webhook:%d:", time.Now().UnixNano())
	store, err := idemredis.New(client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	stripe, err := webhook.Stripe(secret)
	if err != nil {
		t.Fatal(err)
	}
	recv, err := webhook.NewWithBackend(store, &webhook.Config{Provider: "stripe", Verify: stripe, AcknowledgePermanent: true,
		HTTP: idemhttp.Config{FingerprintKeys: testKeys, MaxRequestBytes: limit, Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	var (
		effects        sync.Map // event ID → *atomic.Int64
		othersAnswered = make(chan struct{})
		block          atomic.Bool
	)
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", recv.Handler(webhook.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d *webhook.Delivery) error {
		if tx != nil {
			return errors.New("a transaction without PostgreSQL")
		}
		n, _ := effects.LoadOrStore(d.ID, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if strings.Contains(string(d.Body), "no-such-order") {
			return retry.Permanent(errors.New("no such order"))
		}
		if block.Load() {
			<-othersAnswered
		}
		return nil
	})))
	applied := func(id string) int64 {
		n, ok := effects.Load(id)
		if !ok {
			return 0
		}
		return n.(*atomic.Int64).Load()
	}
	// sign is Stripe's scheme, computed here.
	sign := func(body string, at time.Time) string {
		ts := strconv.FormatInt(at.Unix(), 10)
		m := hmac.New(sha256.New, []byte(secret))
		m.Write([]byte(ts + "." + body))
		return "t=" + ts + ",v1=" + hex.EncodeToString(m.Sum(nil))
	}
	deliver := func(body, signature string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/webhooks/stripe", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Stripe-Signature", signature)
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, r)
		return rec
	}
	keys := func() int {
		k, err := client.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return len(k)
	}

	// Refused deliveries leave nothing.
	evt := `{"id":"evt_r1","object":"event","type":"payment_intent.succeeded","data":{"object":{"amount":2000}}}`
	for what, rec := range map[string]*httptest.ResponseRecorder{
		"bad signature": deliver(evt, sign(evt+" ", time.Now())),
		"old timestamp": deliver(evt, sign(evt, time.Now().Add(-10*time.Minute))),
		"body too long": deliver(`{"id":"evt_r2","pad":"`+strings.Repeat("x", limit)+`"}`, sign(evt, time.Now())),
	} {
		if rec.Code != http.StatusUnauthorized && rec.Code != http.StatusRequestEntityTooLarge {
			t.Fatalf("%s: %d %s", what, rec.Code, rec.Body)
		}
	}
	if n := keys(); n != 0 || applied("evt_r1") != 0 {
		t.Fatalf("%d Redis keys, %d effects after refused deliveries", n, applied("evt_r1"))
	}

	// 1,000 copies at once: the first holds the key until every other one
	// is answered.
	block.Store(true)
	start := make(chan struct{})
	var (
		answered atomic.Int64
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
	)
	signature := sign(evt, time.Now())
	for range copies {
		wg.Go(func() {
			<-start
			rec := deliver(evt, signature)
			mu.Lock()
			statuses[rec.Code]++
			mu.Unlock()
			if answered.Add(1) == copies-1 {
				close(othersAnswered)
			}
		})
	}
	close(start)
	wg.Wait()
	block.Store(false)
	if statuses[http.StatusOK] != 1 || statuses[http.StatusConflict] != copies-1 || applied("evt_r1") != 1 {
		t.Fatalf("answers %v, %d effects; want one 200, %d 409 and one effect", statuses, applied("evt_r1"), copies-1)
	}
	if rec := deliver(evt, sign(evt, time.Now())); rec.Code != http.StatusOK || rec.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("duplicate: %d %s", rec.Code, rec.Body)
	}
	other := strings.Replace(evt, "2000", "9000", 1)
	if rec := deliver(other, sign(other, time.Now())); rec.Code != http.StatusUnprocessableEntity {
		t.Fatalf("another body under the ID: %d %s", rec.Code, rec.Body)
	}
	// A permanent failure acknowledged: stored, replayed, not run again.
	bad := `{"id":"evt_r3","object":"event","data":{"object":{"order":"no-such-order"}}}`
	for i := range 2 {
		rec := deliver(bad, sign(bad, time.Now()))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"status":"failed"`) ||
			(rec.Header().Get(idemhttp.HeaderReplayed) == "true") != (i == 1) {
			t.Fatalf("permanent failure, delivery %d: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	if applied("evt_r1") != 1 || applied("evt_r3") != 1 {
		t.Fatalf("effects: evt_r1 %d, evt_r3 %d; want 1 each", applied("evt_r1"), applied("evt_r3"))
	}
}
