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
// cost without the network. The two sides alternate in rounds of at least
// 64 deliveries (which goes first alternates too), so that both see the
// same machine; each reports its wall time per delivery (the inverse of its
// throughput) and its latency percentiles, and "ratio" is the receiver's
// time per delivery over the bare handler's:
//
//	go test -run '^$' -bench Receiver -benchtime 3000x ./webhook
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
	prefix := rand.Text()[:10]

	var seq atomic.Int64
	// round sends n new deliveries to path, concurrency at a time, and
	// returns its wall time and the deliveries' latencies.
	round := func(b *testing.B, concurrency, n int, path string) (time.Duration, []time.Duration) {
		var next atomic.Int64
		lats := make([][]time.Duration, concurrency)
		var wg sync.WaitGroup
		start := time.Now()
		for g := range concurrency {
			wg.Go(func() {
				for next.Add(1) <= int64(n) {
					i := seq.Add(1)
					body := fmt.Appendf(nil, `{"id":"evt_%s_%d","object":"event","type":"payment_intent.succeeded",`+
						`"data":{"object":{"id":"pi_%d","object":"payment_intent","amount":2000,"currency":"eur"}}}`, prefix, i, i)
					r := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body))
					r.Header.Set("Content-Type", "application/json")
					_ = stripe.Sign(r.Header, body, time.Now())
					rec := httptest.NewRecorder()
					t0 := time.Now()
					mux.ServeHTTP(rec, r)
					lats[g] = append(lats[g], time.Since(t0))
					if rec.Code != http.StatusOK {
						b.Errorf("status %d: %s", rec.Code, rec.Body)
						return
					}
				}
			})
		}
		wg.Wait()
		return time.Since(start), slices.Concat(lats...)
	}
	pct := func(lat []time.Duration, p int) float64 {
		slices.Sort(lat)
		return float64(lat[len(lat)*p/100].Microseconds())
	}
	for _, c := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			size := max(64, 4*c)
			var bareT, recvT time.Duration
			var bareLat, recvLat []time.Duration
			for done, i := 0, 0; done < b.N; i++ {
				n := min(size, b.N-done)
				sides := []string{"/bare", "/webhooks/stripe"}
				if i%2 == 1 {
					slices.Reverse(sides)
				}
				for _, path := range sides {
					d, lat := round(b, c, n, path)
					if path == "/bare" {
						bareT, bareLat = bareT+d, append(bareLat, lat...)
					} else {
						recvT, recvLat = recvT+d, append(recvLat, lat...)
					}
				}
				done += n
			}
			perBare, perRecv := float64(bareT.Microseconds())/float64(b.N), float64(recvT.Microseconds())/float64(b.N)
			b.ReportMetric(perBare, "bare-µs/delivery")
			b.ReportMetric(perRecv, "receiver-µs/delivery")
			b.ReportMetric(perRecv/perBare, "ratio")
			b.ReportMetric(pct(bareLat, 50), "bare-p50-µs")
			b.ReportMetric(pct(recvLat, 50), "receiver-p50-µs")
			b.ReportMetric(pct(bareLat, 99), "bare-p99-µs")
			b.ReportMetric(pct(recvLat, 99), "receiver-p99-µs")
		})
	}
}
