// Command webhooks is the webhook scenario: one service receives
// Stripe-style deliveries on POST /webhooks/stripe (a payment marks its
// order paid and enqueues an OrderPaid event) and GitHub-style deliveries
// on POST /webhooks/github (a push records a build). Each delivery is
// verified, its provider's event ID reserved, and its effect applied in the
// transaction that records the event. Then it replays what providers really
// send — retries, a burst of concurrent copies, a bad signature, an old
// timestamp, another body under an ID already seen, an event that fails for
// good — and checks that each effect happened once: it exits 1 if not.
//
// It needs the development PostgreSQL (scripts/dev start) or
// IDEMKIT_DATABASE_URL, and works in its own schema (-schema, default
// "webhooks_example"), which it migrates. No Kafka is needed: the OrderPaid
// events wait in the outbox for a relay.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/webhook"
)

func main() {
	schema := flag.String("schema", "webhooks_example", "PostgreSQL schema of the example's tables")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	dbURL := os.Getenv("IDEMKIT_DATABASE_URL")
	if dbURL == "" {
		dbURL = "postgres://postgres@127.0.0.1:54329/idemkit?sslmode=disable&connect_timeout=10"
	}
	if err := run(ctx, dbURL, *schema, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "webhooks:", err)
		os.Exit(1)
	}
}

// secrets are what the providers and the service share: the endpoints'
// signing secrets. A real service loads them from its secret store.
type secrets struct {
	stripe, github string
}

// run migrates schema, starts the service on a local port, replays the
// deliveries against it, checks the effects, prints what happened to out,
// and stops the service.
func run(ctx context.Context, dbURL, schema string, out io.Writer) error {
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
	// The example's business tables (yours would come with your
	// migrations). Neither has a constraint that would hide an effect
	// applied twice: the checks below would see it.
	orders, builds := pgx.Identifier{schema, "orders"}.Sanitize(), pgx.Identifier{schema, "builds"}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+orders+` (
		id     text   PRIMARY KEY,
		amount bigint NOT NULL,
		paid   bigint NOT NULL DEFAULT 0,
		status text   NOT NULL DEFAULT 'open'
	)`); err != nil {
		return fmt.Errorf("create orders table: %w", err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+builds+` (
		id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		repository text NOT NULL,
		head       text NOT NULL,
		delivery   text NOT NULL
	)`); err != nil {
		return fmt.Errorf("create builds table: %w", err)
	}
	// Names of this run, so that runs on one schema stay apart.
	run := strings.ToLower(rand.Text()[:8])
	s := scenario{run: run, orderA: "order-" + run + "-1", orderB: "order-" + run + "-2"}
	if _, err := pool.Exec(ctx, `INSERT INTO `+orders+` (id, amount) VALUES ($1, 2500), ($2, 1800)`, s.orderA, s.orderB); err != nil {
		return err
	}

	tel, metrics, err := idemotel.NewPrometheus(nil)
	if err != nil {
		return err
	}
	events, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return err
	}
	sec := secrets{stripe: "whsec_" + rand.Text(), github: rand.Text()}
	logger := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelWarn,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}}))
	svc, err := newService(pool, schema, events, tel, sec, logger)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/", svc)
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
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "service listening on %s (POST /webhooks/stripe, POST /webhooks/github, GET /metrics)\n", base)

	transport := &http.Transport{MaxIdleConnsPerHost: 32}
	defer transport.CloseIdleConnections()
	p, err := newProviders(sec, base, &http.Client{Transport: transport, Timeout: 10 * time.Second})
	if err != nil {
		return err
	}
	failed := s.replay(ctx, p, out)

	// The effects, from the tables.
	var paidA, paidB, unknown, paidEvents, buildsA, buildsB int64
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT paid FROM `+orders+` WHERE id = $1), (SELECT paid FROM `+orders+` WHERE id = $2),
		(SELECT count(*) FROM `+orders+` WHERE id = $3),
		(SELECT count(*) FROM `+events.Table()+` WHERE topic = 'orders' AND msg_key IN ($4, $5)),
		(SELECT count(*) FROM `+builds+` WHERE head = $6), (SELECT count(*) FROM `+builds+` WHERE head = $7)`,
		s.orderA, s.orderB, "order-"+run+"-404", []byte(s.orderA), []byte(s.orderB), s.commit(1), s.commit(2),
	).Scan(&paidA, &paidB, &unknown, &paidEvents, &buildsA, &buildsB); err != nil {
		return err
	}
	fmt.Fprintln(out, "effects:")
	check := func(what string, got, want int64) {
		mark := "ok"
		if got != want {
			mark, failed = "WRONG", failed+1
		}
		fmt.Fprintf(out, "  %-58s %6d (want %d) %s\n", what, got, want, mark)
	}
	check(s.orderA+" paid (2500 once)", paidA, 2500)
	check(s.orderB+" paid (1800 once)", paidB, 1800)
	check("orders created for the unknown order", unknown, 0)
	check("OrderPaid events in the outbox", paidEvents, 2)
	check("builds of the first push", buildsA, 1)
	check("builds of the pushed-again commit (a burst of copies)", buildsB, 1)
	if err := printMetrics(ctx, base+"/metrics", out); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d checks failed", failed)
	}
	fmt.Fprintln(out, "every delivery answered as expected; every effect happened once")
	return nil
}

// newService returns the service's routes: a receiver per provider.
func newService(pool *pgxpool.Pool, schema string, events *outbox.Store, tel *idemotel.Telemetry, sec secrets,
	logger *slog.Logger) (http.Handler, error) {
	records, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return nil, err
	}
	// The fingerprints' secret: a real service loads 32 random bytes or
	// more from its secret store, the same on every process.
	fingerprintKey := make([]byte, 32)
	_, _ = rand.Read(fingerprintKey)
	h := &handlers{orders: pgx.Identifier{schema, "orders"}.Sanitize(), builds: pgx.Identifier{schema, "builds"}.Sanitize(),
		events: events}
	mux := http.NewServeMux()

	stripe, err := webhook.Stripe(sec.stripe) // list the old secret too while Stripe rolls it
	if err != nil {
		return nil, err
	}
	stripeCfg := &webhook.Config{
		Provider: "stripe",
		Verify:   stripe, // the event ID is the "id" member of the signed body
		// An event about an order this service does not have will not
		// succeed later: store the failure as the answer (and alert on
		// idemkit_webhook_deliveries_total{outcome="failed"}) rather than
		// have Stripe retry it for three days.
		AcknowledgePermanent: true,
		HTTP:                 idemhttp.Config{Store: records, FingerprintKeys: [][]byte{fingerprintKey}, Logger: logger},
	}
	if err := tel.Webhook(stripeCfg); err != nil { // deliveries by provider and outcome
		return nil, err
	}
	stripeReceiver, err := webhook.New(pool, stripeCfg)
	if err != nil {
		return nil, err
	}
	mux.Handle("POST /webhooks/stripe", stripeReceiver.Handler(webhook.HandlerFunc(h.stripeEvent)))

	github, err := webhook.GitHub(sec.github)
	if err != nil {
		return nil, err
	}
	githubCfg := &webhook.Config{
		Provider: "github",
		Verify:   github, // the event ID is the X-GitHub-Delivery header
		HTTP:     idemhttp.Config{Store: records, FingerprintKeys: [][]byte{fingerprintKey}, Logger: logger},
	}
	if err := tel.Webhook(githubCfg); err != nil {
		return nil, err
	}
	githubReceiver, err := webhook.New(pool, githubCfg)
	if err != nil {
		return nil, err
	}
	mux.Handle("POST /webhooks/github", githubReceiver.Handler(webhook.HandlerFunc(h.githubEvent)))
	return mux, nil
}

// handlers apply the deliveries' effects.
type handlers struct {
	orders, builds string // quoted table names
	events         *outbox.Store
}

// stripeEvent marks the order of a succeeded payment paid, in the
// transaction that records the event, and enqueues OrderPaid.
func (h *handlers) stripeEvent(ctx context.Context, tx pgx.Tx, d *webhook.Delivery) error {
	var ev struct {
		Type string `json:"type"`
		Data struct {
			Object struct {
				Amount   int64             `json:"amount"`
				Metadata map[string]string `json:"metadata"`
			} `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(d.Body, &ev); err != nil {
		return retry.Permanent(fmt.Errorf("event %s: %w", d.ID, err))
	}
	if ev.Type != "payment_intent.succeeded" {
		return nil // acknowledged: nothing to do for this type
	}
	order := ev.Data.Object.Metadata["order_id"]
	tag, err := tx.Exec(ctx, `UPDATE `+h.orders+` SET paid = paid + $2, status = 'paid' WHERE id = $1`,
		order, ev.Data.Object.Amount)
	if err != nil {
		return err // 500: rolled back, Stripe sends the event again
	}
	if tag.RowsAffected() == 0 {
		return retry.Permanent(fmt.Errorf("no order %q", order)) // stored as the answer: AcknowledgePermanent
	}
	paid, _ := json.Marshal(map[string]any{"type": "OrderPaid", "order_id": order, "amount": ev.Data.Object.Amount})
	_, err = h.events.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Key: []byte(order), Value: paid})
	return err
}

// githubEvent records a build for each push.
func (h *handlers) githubEvent(ctx context.Context, tx pgx.Tx, d *webhook.Delivery) error {
	if d.Request.Header.Get("X-GitHub-Event") != "push" {
		return nil
	}
	var push struct {
		After      string `json:"after"`
		Repository struct {
			FullName string `json:"full_name"`
		} `json:"repository"`
	}
	if err := json.Unmarshal(d.Body, &push); err != nil {
		return retry.Permanent(fmt.Errorf("push %s: %w", d.ID, err))
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+h.builds+` (repository, head, delivery) VALUES ($1, $2, $3)`,
		push.Repository.FullName, push.After, d.ID)
	return err
}

// printMetrics prints the receivers' delivery counters from /metrics.
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
	fmt.Fprintln(out, "metrics (curl -s .../metrics | grep ^idemkit_webhook_deliveries_total; zeros and otel_scope labels left out):")
	scope := regexp.MustCompile(`otel_scope_\w+="[^"]*",?`)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "idemkit_webhook_deliveries_total") && !strings.HasSuffix(line, " 0") {
			fmt.Fprintln(out, "  "+scope.ReplaceAllString(line, ""))
		}
	}
	return nil
}
