package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// BenchmarkMiddleware compares, on the same PostgreSQL, a bare handler that
// writes one payment row in its own transaction with the same handler behind
// the middleware: a first request (reserve, handler in the middleware's
// transaction, complete, commit) and a replay (one statement). Requests go
// straight to ServeHTTP, so the numbers are the handler and database cost
// without the network stack. Each reports p50 and p99 latency.
func BenchmarkMiddleware(b *testing.B) {
	db := testenv.NewDB(b, migrated)
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		b.Fatal(err)
	}
	mw, err := idemhttp.New(db.Pool, &idemhttp.Config{
		Store:           store,
		FingerprintKeys: testKeys,
		Account:         func(*http.Request) (string, error) { return "acct-1", nil },
		Logger:          slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	insert := "INSERT INTO " + db.Table("payments") + " (account, order_id, amount) VALUES ('acct-1', 'order-842', 10000)"
	write := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":1,"orderId":"order-842","amount":10000}`))
	}
	bare := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := pgx.BeginFunc(r.Context(), db.Pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(r.Context(), insert)
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		write(w)
	})
	wrapped := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.Tx(r.Context())
		if _, err := tx.Exec(r.Context(), insert); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		write(w)
	}))
	serve := func(b *testing.B, h http.Handler, key string) {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(payment))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set(idemhttp.HeaderKey, key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	run := func(b *testing.B, key func(i int) string, h http.Handler) {
		lat := make([]time.Duration, 0, b.N)
		i := 0
		for b.Loop() {
			k := key(i)
			i++
			start := time.Now()
			serve(b, h, k)
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		if len(lat) > 0 {
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, func(int) string { return "" }, bare) })
	b.Run("first", func(b *testing.B) {
		prefix := newKey()
		run(b, func(i int) string { return prefix + "-" + itoa(i) }, wrapped)
	})
	b.Run("replay", func(b *testing.B) {
		key := newKey()
		serve(b, wrapped, key)
		run(b, func(int) string { return key }, wrapped)
	})
	_, _ = db.Pool.Exec(context.Background(), "SELECT 1")
}

func itoa(i int) string {
	const digits = "0123456789"
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append(b, digits[i%10])
	}
	slices.Reverse(b)
	return string(b)
}
