package webhook_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/webhook"
)

// BenchmarkReceiver compares, on the same PostgreSQL, a bare handler that
// writes a delivery's row in a transaction of its own with the same write
// behind a Receiver (Stripe's scheme: verification, the event ID from the
// JSON body, its reservation, the handler in the record's transaction, the
// record and the commit), at 1, 16 and 64 deliveries at once. Every
// delivery is a new event, signed the same way for both. Requests go
// straight to ServeHTTP: the numbers are the handler's and the database's
// cost without the network. ns/op is wall time per delivery (its inverse is
// the throughput); each also reports p50 and p99 latency. The sub-benchmarks
// alternate bare and receiver at each concurrency, so that -count runs
// interleave them:
//
//	go test -run '^$' -bench Receiver -benchtime 2000x -count 3 ./webhook
func BenchmarkReceiver(b *testing.B) {
	ctx := context.Background()
	db := testenv.NewDB(b, migrated)
	pcfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(b))
	if err != nil {
		b.Fatal(err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = ""
	pcfg.MaxConns = 72 // not the bound at 64 deliveries at once
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		b.Fatal(err)
	}
	const secret = "whsec_benchmark0endpoint0signing0secret"
	stripe, err := webhook.Stripe(secret)
	if err != nil {
		b.Fatal(err)
	}
	recv, err := webhook.New(pool, &webhook.Config{Provider: "stripe", Verify: stripe,
		HTTP: idemhttp.Config{Store: store, FingerprintKeys: testKeys, Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		b.Fatal(err)
	}
	insert := `INSERT INTO ` + db.Table("effects") + ` (provider, event_id, body) VALUES ('stripe', $1, $2)`
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		err = pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), insert, "bare", string(body))
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"processed"}`))
	})
	received := recv.Handler(webhook.HandlerFunc(func(ctx context.Context, tx pgx.Tx, d *webhook.Delivery) error {
		_, err := tx.Exec(ctx, insert, d.ID, string(d.Body))
		return err
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /bare", bare)
	mux.Handle("POST /webhooks/stripe", received)

	run := func(b *testing.B, concurrency int, path string) {
		prefix := rand.Text()[:10]
		var next atomic.Int64
		lats := make([][]time.Duration, concurrency)
		var wg sync.WaitGroup
		b.ResetTimer()
		for g := range concurrency {
			wg.Go(func() {
				for {
					i := next.Add(1)
					if i > int64(b.N) {
						return
					}
					body := fmt.Appendf(nil, `{"id":"evt_%s_%d","object":"event","type":"payment_intent.succeeded",`+
						`"data":{"object":{"id":"pi_%d","object":"payment_intent","amount":2000,"currency":"eur"}}}`, prefix, i, i)
					r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
					r.Header.Set("Content-Type", "application/json")
					_ = stripe.Sign(r.Header, body, time.Now())
					rec := httptest.NewRecorder()
					start := time.Now()
					mux.ServeHTTP(rec, r)
					lats[g] = append(lats[g], time.Since(start))
					if rec.Code != http.StatusOK {
						b.Errorf("status %d: %s", rec.Code, rec.Body)
						return
					}
				}
			})
		}
		wg.Wait()
		b.StopTimer()
		all := slices.Concat(lats...)
		slices.Sort(all)
		if len(all) > 0 {
			b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
		}
	}
	for _, c := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("c=%d/bare", c), func(b *testing.B) { run(b, c, "/bare") })
		b.Run(fmt.Sprintf("c=%d/receiver", c), func(b *testing.B) { run(b, c, "/webhooks/stripe") })
	}
}
