// Command payments is the Idempotency-Key scenario: POST /payments creates a
// payment and enqueues a PaymentCreated event through the outbox, in the
// transaction that also completes the idempotency record. A client whose
// first responses are lost retries with the same key and, in the end, the
// card was charged once.
//
// It needs the development PostgreSQL (scripts/dev start) or
// IDEMKIT_DATABASE_URL, and works in its own schema (-schema, default
// "payments_example"), which it migrates. No Kafka is needed: the event
// waits in the outbox for a relay.
//
// With -store redis the idempotency records live in Redis (module
// github.com/idemkit/idemkit/idemredis; -redis URL, default $IDEMKIT_REDIS_URL
// or the development server of scripts/dev redis): the payment and its
// event then commit in a transaction of the handler's own, and the record
// is written after it (see that package for what this cannot promise).
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/idemredis"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

func main() {
	schema := flag.String("schema", "payments_example", "PostgreSQL schema of the example's tables")
	store := flag.String("store", "postgres", "where the idempotency records live: postgres or redis")
	redisURL := flag.String("redis", cmp.Or(os.Getenv("IDEMKIT_REDIS_URL"), "redis://127.0.0.1:16379/0"),
		"Redis URL for -store redis (default $IDEMKIT_REDIS_URL, else the development server)")
	flag.Parse()
	if *store != "postgres" && *store != "redis" {
		fmt.Fprintf(os.Stderr, "payments: -store %q: want postgres or redis\n", *store)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dbURL := os.Getenv("IDEMKIT_DATABASE_URL")
	if dbURL == "" {
		dbURL = "postgres://postgres@127.0.0.1:54329/idemkit?sslmode=disable&connect_timeout=10"
	}
	if *store != "redis" {
		*redisURL = ""
	}
	if err := run(ctx, dbURL, *schema, *redisURL, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "payments:", err)
		os.Exit(1)
	}
}

// run migrates schema, starts the API on a local port, runs the client
// scenario against it, prints what happened to out, and stops the API. With
// redisURL, the idempotency records live in that Redis.
func run(ctx context.Context, dbURL, schema, redisURL string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer pool.Close()

	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	// The example's business table (yours would come with your migrations).
	payments := pgx.Identifier{schema, "payments"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+payments+` (
		id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		account    text   NOT NULL,
		order_id   text   NOT NULL,
		amount     bigint NOT NULL,
		currency   text   NOT NULL,
		request    text   NOT NULL, -- the Idempotency-Key, for support and reconciliation
		created_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("create payments table: %w", err)
	}

	// Metrics on /metrics (OpenTelemetry's Prometheus exporter) and a span
	// per request whose trace the PaymentCreated event carries.
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.WithoutCancel(ctx)) }()
	tel, metrics, err := idemotel.NewPrometheus(&idemotel.Config{TracerProvider: tp})
	if err != nil {
		return err
	}
	ocfg := &outbox.Config{Tables: migrate.Tables{Schema: schema}}
	if err := tel.Outbox(ocfg); err != nil { // the request's trace context goes with the event
		return err
	}
	events, err := outbox.New(ocfg)
	if err != nil {
		return err
	}
	var records idemhttp.Backend // nil: PostgreSQL, with the business writes
	if redisURL != "" {
		opts, err := redis.ParseURL(redisURL)
		if err != nil {
			return fmt.Errorf("-redis: %w", err)
		}
		client := redis.NewClient(opts)
		defer client.Close()
		if records, err = idemredis.New(client, &idemredis.Config{Prefix: "payments-example:" + schema + ":"}); err != nil {
			return err
		}
		fmt.Fprintln(out, "records: Redis", opts.Addr)
	}
	api, err := newAPI(pool, schema, records, events, tel)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", api)
	mux.Handle("GET /metrics", metrics)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	defer func() {
		shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
		wg.Wait()
	}()
	url := "http://" + ln.Addr().String() + "/payments"
	fmt.Fprintf(out, "API listening on %s, metrics on http://%s/metrics\n", url, ln.Addr())

	// One intention, one key, created before the first attempt and reused
	// by every retry. A random key keeps runs apart.
	key := "pay-order-842-" + rand.Text()
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: &dropResponses{next: transport, drop: 2, out: out}, Timeout: 10 * time.Second}
	body := `{"orderId":"order-842","amount":10000,"currency":"BRL"}`
	resp, err := postWithRetries(ctx, client, url, key, body, out)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "client: got %d %s (Idempotent-Replayed: %q)\n", resp.status, resp.body, resp.replayed)

	var charges, n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+payments+" WHERE request = $1", key).Scan(&charges); err != nil {
		return err
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+events.Table()+" WHERE topic = 'payments' AND msg_key = $1",
		[]byte(key)).Scan(&n); err != nil {
		return err
	}
	fmt.Fprintf(out, "charges for order-842: %d, PaymentCreated events in the outbox: %d\n", charges, n)
	if charges != 1 || n != 1 {
		return fmt.Errorf("want one charge and one event, got %d and %d", charges, n)
	}
	return printMetrics(ctx, "http://"+ln.Addr().String()+"/metrics", out)
}

// printMetrics prints the middleware's request counters from /metrics.
func printMetrics(ctx context.Context, url string, out io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	fmt.Fprintln(out, "metrics (curl -s .../metrics | grep ^idemkit_http_requests_total):")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "idemkit_http_requests_total") {
			fmt.Fprintln(out, "  "+line)
		}
	}
	return nil
}

// newAPI returns the payments API: POST /payments behind the middleware.
// With records, the idempotency records live there instead of PostgreSQL.
func newAPI(pool *pgxpool.Pool, schema string, records idemhttp.Backend, events *outbox.Store,
	tel *idemotel.Telemetry) (http.Handler, error) {
	// The fingerprints' secret: a real API loads 32 random bytes or more from
	// its secret store, the same on every process; this demo makes one.
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	cfg := &idemhttp.Config{
		FingerprintKeys: [][]byte{secret},
		// A real API takes the principal from its authentication.
		Account: func(*http.Request) (string, error) { return "acct-demo", nil },
		Logger:  slog.New(idemotel.LogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))),
	}
	front, err := tel.HTTP(cfg) // a span per request; requests counted by outcome
	if err != nil {
		return nil, err
	}
	var mw *idemhttp.Middleware
	if records != nil {
		mw, err = idemhttp.NewWithBackend(records, cfg)
	} else {
		if cfg.Store, err = idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: schema}}); err != nil {
			return nil, err
		}
		mw, err = idemhttp.New(pool, cfg)
	}
	if err != nil {
		return nil, err
	}
	payments := pgx.Identifier{schema, "payments"}.Sanitize()
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p struct {
			OrderID  string `json:"orderId"`
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.OrderID == "" || p.Amount <= 0 || p.Currency == "" {
			writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": "want orderId, a positive amount and currency"})
			return
		}
		ctx := r.Context()
		tx, managed := idemhttp.Tx(ctx)
		if !managed { // records in Redis: the effects commit in a transaction of their own
			own, err := pool.Begin(ctx)
			if err != nil {
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "try again"})
				return
			}
			defer func() { _ = own.Rollback(context.WithoutCancel(ctx)) }()
			tx = own
		}
		var id int64
		if err := tx.QueryRow(ctx, "INSERT INTO "+payments+
			" (account, order_id, amount, currency, request) VALUES ('acct-demo', $1, $2, $3, $4) RETURNING id",
			p.OrderID, p.Amount, p.Currency, r.Header.Get(idemhttp.HeaderKey)).Scan(&id); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "try again"})
			return
		}
		event, _ := json.Marshal(map[string]any{"type": "PaymentCreated", "paymentId": id, "orderId": p.OrderID,
			"amount": p.Amount, "currency": p.Currency})
		if _, err := events.EnqueueTx(ctx, tx, outbox.Message{
			Topic: "payments", Key: []byte(r.Header.Get(idemhttp.HeaderKey)), Value: event,
		}); err != nil {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "try again"})
			return
		}
		if !managed {
			if err := tx.Commit(ctx); err != nil {
				writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "try again"})
				return
			}
		}
		w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
		writeJSON(w, http.StatusCreated, map[string]any{"id": id, "orderId": p.OrderID, "status": "captured"})
	})))
	return front(mux), nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// dropResponses is a RoundTripper that loses the first drop responses after
// the server sent them: the request was processed, the client sees a
// network error. This is the case idempotency keys exist for.
type dropResponses struct {
	next http.RoundTripper
	out  io.Writer

	mu   sync.Mutex
	drop int
}

func (d *dropResponses) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	lose := d.drop > 0
	if lose {
		d.drop--
	}
	d.mu.Unlock()
	if !lose {
		return resp, nil
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	fmt.Fprintf(d.out, "network: the server answered %d, the answer was lost\n", resp.StatusCode)
	return nil, errors.New("connection reset by peer (simulated)")
}

type result struct {
	status   int
	body     string
	replayed string
}

// postWithRetries sends the payment with the same key until it gets an
// answer that is not worth retrying: network errors, 409 (in flight) and
// 5xx are retried with backoff.
func postWithRetries(ctx context.Context, client *http.Client, url, key, body string, out io.Writer) (result, error) {
	pause := 50 * time.Millisecond
	for attempt := 1; attempt <= 8; attempt++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			return result{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, key)
		resp, err := client.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if rerr == nil && resp.StatusCode != http.StatusConflict && resp.StatusCode < 500 {
				fmt.Fprintf(out, "client: attempt %d answered\n", attempt)
				return result{status: resp.StatusCode, body: strings.TrimSpace(string(b)),
					replayed: resp.Header.Get(idemhttp.HeaderReplayed)}, nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		fmt.Fprintf(out, "client: attempt %d failed (%v); retrying with the same key\n", attempt, err)
		select {
		case <-ctx.Done():
			return result{}, ctx.Err()
		case <-time.After(pause):
		}
		pause *= 2
	}
	return result{}, errors.New("gave up after 8 attempts")
}
