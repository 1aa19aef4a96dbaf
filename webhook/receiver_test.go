package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/webhook"
)

// testKeys is the tests' idemhttp.Config.FingerprintKeys.
var testKeys = [][]byte{[]byte("webhook tests: a fingerprint secret of 32 bytes or more")}

// migrated is a testenv setup: idemkit's migrations in the test's schema
// and the business table the handlers write, without a unique constraint so
// that an effect applied twice shows.
func migrated(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "effects"}.Sanitize()+` (
		provider text NOT NULL,
		event_id text NOT NULL,
		body     text NOT NULL
	)`)
	return err
}

// env is one test's receiver for one provider, on a fresh schema.
type env struct {
	t        *testing.T
	f        fixture
	db       *testenv.DB
	scheme   *webhook.Scheme
	recv     *webhook.Receiver
	mux      *http.ServeMux
	logs     *testenv.Logs
	calls    atomic.Int64
	hookMu   sync.Mutex
	hook     func(ctx context.Context, tx pgx.Tx, d *webhook.Delivery) error // after the effect's insert
	eventsMu sync.Mutex
	events   []webhook.Event
}

// newEnv builds a receiver for f's provider (secrets: the current and the
// previous one); tweak may change the Config before New.
func newEnv(t *testing.T, f fixture, tweak func(*webhook.Config)) *env {
	t.Helper()
	e := &env{t: t, f: f, db: testenv.NewDB(t, migrated), mux: http.NewServeMux()}
	e.scheme = newScheme(t, f, f.secrets[0], f.secrets[1])
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	var logger *slog.Logger
	e.logs, logger = testenv.NewLogs(t)
	cfg := &webhook.Config{
		Provider: f.name,
		Verify:   e.scheme,
		Observe: func(_ context.Context, ev webhook.Event) {
			e.eventsMu.Lock()
			e.events = append(e.events, ev)
			e.eventsMu.Unlock()
		},
		HTTP: idemhttp.Config{Store: store, FingerprintKeys: testKeys, Logger: logger},
	}
	if tweak != nil {
		tweak(cfg)
	}
	e.recv, err = webhook.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.mux.Handle("POST /webhooks/"+f.name, e.recv.Handler(webhook.HandlerFunc(e.apply)))
	return e
}

// apply is the handler under test: one row per application of an event.
func (e *env) apply(ctx context.Context, tx pgx.Tx, d *webhook.Delivery) error {
	e.calls.Add(1)
	if d.Provider != e.f.name || d.ID == "" {
		return fmt.Errorf("delivery of %q, ID %q", d.Provider, d.ID)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+e.db.Table("effects")+` (provider, event_id, body) VALUES ($1, $2, $3)`,
		d.Provider, d.ID, string(d.Body)); err != nil {
		return err
	}
	e.hookMu.Lock()
	h := e.hook
	e.hookMu.Unlock()
	if h != nil {
		return h(ctx, tx, d)
	}
	return nil
}

func (e *env) setHook(h func(ctx context.Context, tx pgx.Tx, d *webhook.Delivery) error) {
	e.hookMu.Lock()
	e.hook = h
	e.hookMu.Unlock()
}

// event returns a JSON event body naming id, with a value that tells two
// bodies of one event apart.
func event(id string, n int) []byte {
	return fmt.Appendf(nil, `{"id":%q,"object":"event","type":"order.paid","data":{"object":{"order":"o-%d"}}}`, id, n)
}

// deliver sends a delivery of body, for event id, signed with the current
// secret now, and returns the answer.
func (e *env) deliver(id string, body []byte) *httptest.ResponseRecorder {
	return e.send(signed(e.t, e.f, e.f.secrets[0], id, body, time.Now()))
}

func (e *env) send(r *http.Request) *httptest.ResponseRecorder {
	r.URL.Path = "/webhooks/" + e.f.name
	rec := httptest.NewRecorder()
	e.mux.ServeHTTP(rec, r)
	return rec
}

func (e *env) count(query string, args ...any) int {
	e.t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(context.Background(), query, args...).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// effects counts the applications of event id.
func (e *env) effects(id string) int {
	return e.count(`SELECT count(*) FROM `+e.db.Table("effects")+` WHERE event_id = $1`, id)
}

func (e *env) records() int {
	return e.count(`SELECT count(*) FROM ` + e.db.Table("idempotency_records"))
}

func (e *env) outcomes() []webhook.Outcome {
	e.eventsMu.Lock()
	defer e.eventsMu.Unlock()
	var out []webhook.Outcome
	for _, ev := range e.events {
		out = append(out, ev.Outcome)
	}
	return out
}

func wantAnswer(t *testing.T, rec *httptest.ResponseRecorder, status int, replayed bool) {
	t.Helper()
	if rec.Code != status || (rec.Header().Get(idemhttp.HeaderReplayed) == "true") != replayed {
		t.Fatalf("answer %d replayed=%q %s; want %d replayed=%v", rec.Code, rec.Header().Get(idemhttp.HeaderReplayed),
			rec.Body, status, replayed)
	}
}

func wantCode(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) {
	t.Helper()
	var b struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(rec.Body.Bytes(), &b)
	if rec.Code != status || b.Error.Code != code {
		t.Fatalf("answer %d %s; want %d %s", rec.Code, rec.Body, status, code)
	}
}

// forProviders runs f in a parallel subtest per provider.
func forProviders(t *testing.T, run func(t *testing.T, f fixture)) {
	t.Helper()
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			run(t, f)
		})
	}
}

// TestOnce: per provider, the first delivery runs the handler and commits
// its effect with the answer; the provider's retry (signed anew, later,
// with the previous secret during a rotation) gets the stored answer and
// runs nothing.
func TestOnce(t *testing.T) {
	t.Parallel()
	forProviders(t, func(t *testing.T, f fixture) {
		e := newEnv(t, f, nil)
		body := event("evt_1", 1)
		rec := e.deliver("evt_1", body)
		wantAnswer(t, rec, http.StatusOK, false)
		first := rec.Body.String()
		if first != `{"status":"processed"}` {
			t.Fatalf("answer body %s", first)
		}
		retried := signed(t, f, f.secrets[1], "evt_1", body, time.Now().Add(time.Second))
		rec = e.send(retried)
		wantAnswer(t, rec, http.StatusOK, true)
		if rec.Body.String() != first {
			t.Fatalf("replayed %s, first %s", rec.Body, first)
		}
		if n := e.effects("evt_1"); n != 1 || e.calls.Load() != 1 {
			t.Fatalf("%d effects, %d handler calls; want 1, 1", n, e.calls.Load())
		}
		// Another event runs.
		wantAnswer(t, e.deliver("evt_2", event("evt_2", 2)), http.StatusOK, false)
		if got := e.outcomes(); fmt.Sprint(got) != "[processed duplicate processed]" {
			t.Fatalf("outcomes %v", got)
		}
	})
}

// TestUnverified: a delivery with a bad or missing signature, or signed
// with a secret the receiver does not know, gets 401: no record, no handler
// call, the body not echoed; an authentic one signed too long ago gets 401
// timestamp_invalid. The same event properly signed then runs.
func TestUnverified(t *testing.T) {
	t.Parallel()
	forProviders(t, func(t *testing.T, f fixture) {
		e := newEnv(t, f, nil)
		body := []byte(`{"id":"evt_5","data":{"marker":"s3cr3t-b0dy"}}`)
		check := func(what string, r *http.Request, code string) {
			t.Helper()
			rec := e.send(r)
			wantCode(t, rec, http.StatusUnauthorized, code)
			if strings.Contains(rec.Body.String(), "s3cr3t-b0dy") {
				t.Fatalf("%s: the answer echoes the body: %s", what, rec.Body)
			}
		}
		unknown := signed(t, f, f.secrets[2], "evt_5", body, time.Now())
		check("unknown secret", unknown, webhook.CodeSignatureInvalid)
		tampered := signed(t, f, f.secrets[0], "evt_5", body, time.Now())
		tampered.Body = io.NopCloser(strings.NewReader(strings.Replace(string(body), "s3cr3t", "s3cr3T", 1)))
		check("tampered", tampered, webhook.CodeSignatureInvalid)
		bare := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(body)))
		bare.Header.Set("X-GitHub-Delivery", "evt_5")
		bare.Header.Set("X-Shopify-Webhook-Id", "evt_5")
		bare.Header.Set("Webhook-Id", "evt_5")
		check("unsigned", bare, webhook.CodeSignatureInvalid)
		wantOutcomes := "[bad_signature bad_signature bad_signature"
		if f.timestamped {
			check("old", signed(t, f, f.secrets[0], "evt_5", body, time.Now().Add(-time.Hour)), webhook.CodeTimestampInvalid)
			wantOutcomes += " bad_timestamp"
		}
		if n := e.records(); n != 0 || e.calls.Load() != 0 {
			t.Fatalf("%d records, %d handler calls after refused deliveries; want 0, 0", n, e.calls.Load())
		}
		wantAnswer(t, e.deliver("evt_5", body), http.StatusOK, false)
		if got := fmt.Sprint(e.outcomes()); got != wantOutcomes+" processed]" {
			t.Fatalf("outcomes %v", got)
		}
		if n := e.logs.Count("webhook: delivery refused: not verified", ""); n != strings.Count(wantOutcomes, "bad_") {
			t.Fatalf("%d WARN lines for refused deliveries", n)
		}
	})
}

// TestConcurrentDuplicates: per provider, 1,000 copies of one delivery at
// once apply its effect once. The first to hold the key stays in the
// handler until every other copy is answered, so that they all meet it
// in flight; afterwards, another copy gets the stored answer.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const copies = 1000
	forProviders(t, func(t *testing.T, f fixture) {
		e := newEnv(t, f, func(c *webhook.Config) { c.HTTP.Logger = slog.New(slog.DiscardHandler) })
		othersAnswered := make(chan struct{})
		e.setHook(func(ctx context.Context, _ pgx.Tx, _ *webhook.Delivery) error {
			select {
			case <-othersAnswered:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		body := event("evt_c", 1)
		start := make(chan struct{})
		var (
			answered atomic.Int64
			wg       sync.WaitGroup
			mu       sync.Mutex
			statuses = map[string]int{}
		)
		for range copies {
			r := signed(t, f, f.secrets[0], "evt_c", body, time.Now())
			wg.Go(func() {
				<-start
				rec := e.send(r)
				mu.Lock()
				statuses[fmt.Sprintf("%d replayed=%s", rec.Code, rec.Header().Get(idemhttp.HeaderReplayed))]++
				mu.Unlock()
				if answered.Add(1) == copies-1 {
					close(othersAnswered)
				}
			})
		}
		close(start)
		wg.Wait()
		// A copy that waited past its pooled connection's bound gets 503,
		// which the provider retries like 409.
		if statuses["200 replayed="] != 1 || statuses["409 replayed="]+statuses["503 replayed="] != copies-1 {
			t.Fatalf("answers %v; want one 200 and %d 409 (or 503)", statuses, copies-1)
		}
		if n := e.effects("evt_c"); n != 1 || e.calls.Load() != 1 {
			t.Fatalf("%d effects, %d handler calls; want 1, 1", n, e.calls.Load())
		}
		wantAnswer(t, e.deliver("evt_c", body), http.StatusOK, true)
	})
}

// TestBodyLimit: a body of exactly MaxRequestBytes is received; one byte
// more gets 413, before verification, and leaves nothing.
func TestBodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 2048
	forProviders(t, func(t *testing.T, f fixture) {
		e := newEnv(t, f, func(c *webhook.Config) { c.HTTP.MaxRequestBytes = limit })
		sized := func(id string, n int) []byte {
			b := fmt.Sprintf(`{"id":%q,"pad":""}`, id)
			return []byte(strings.Replace(b, `"pad":""`, `"pad":"`+strings.Repeat("x", n-len(b))+`"`, 1))
		}
		over := sized("evt_big", limit+1)
		wantCode(t, e.deliver("evt_big", over), http.StatusRequestEntityTooLarge, idemhttp.CodeRequestTooLarge)
		if n := e.records(); n != 0 || e.calls.Load() != 0 {
			t.Fatalf("%d records, %d calls after 413", n, e.calls.Load())
		}
		at := sized("evt_big", limit)
		wantAnswer(t, e.deliver("evt_big", at), http.StatusOK, false)
		if n := e.effects("evt_big"); n != 1 {
			t.Fatalf("%d effects", n)
		}
		var stored string
		if err := e.db.Pool.QueryRow(context.Background(), `SELECT body FROM `+e.db.Table("effects")).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != string(at) {
			t.Fatalf("the handler got %d bytes, want the whole body of %d", len(stored), len(at))
		}
	})
}

// TestKeyReused: an event ID that comes again with another body gets 422,
// runs nothing, and is logged at ERROR; the same body still replays.
func TestKeyReused(t *testing.T) {
	t.Parallel()
	forProviders(t, func(t *testing.T, f fixture) {
		e := newEnv(t, f, nil)
		wantAnswer(t, e.deliver("evt_r", event("evt_r", 1)), http.StatusOK, false)
		wantCode(t, e.deliver("evt_r", event("evt_r", 2)), http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
		wantAnswer(t, e.deliver("evt_r", event("evt_r", 1)), http.StatusOK, true)
		if n := e.effects("evt_r"); n != 1 || e.calls.Load() != 1 {
			t.Fatalf("%d effects, %d calls", n, e.calls.Load())
		}
		n := e.logs.CountFunc("webhook: event ID reused with another body; nothing ran (422)", func(rec map[string]any) bool {
			return rec["level"] == "ERROR" && rec["provider"] == f.name && rec["event_id"] == "evt_r"
		})
		if n != 1 {
			t.Fatalf("%d ERROR lines for the reused ID, want 1", n)
		}
	})
}

// TestStripeIntent: Stripe's fingerprint leaves out pending_webhooks, which
// counts the endpoints still to receive an event; any other change is
// another body.
func TestStripeIntent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, fixtures[2], nil)
	body := func(pending int, amount int) []byte {
		return fmt.Appendf(nil, `{"id":"evt_p","object":"event","type":"payment_intent.succeeded",`+
			`"data":{"object":{"id":"pi_1","amount":%d}},"pending_webhooks":%d}`, amount, pending)
	}
	wantAnswer(t, e.deliver("", body(2, 100)), http.StatusOK, false)
	wantAnswer(t, e.deliver("", body(1, 100)), http.StatusOK, true)
	wantCode(t, e.deliver("", body(1, 200)), http.StatusUnprocessableEntity, idemhttp.CodeKeyReused)
}

// TestEventID: where the ID is missing or not a string, the delivery gets
// 400 and nothing is stored.
func TestEventID(t *testing.T) {
	t.Parallel()
	stripe := newEnv(t, fixtures[2], nil)
	wantCode(t, stripe.deliver("", []byte(`{"object":"event","type":"order.paid"}`)), http.StatusBadRequest,
		idemhttp.CodeKeyMissing)
	wantCode(t, stripe.deliver("", []byte(`{"id":12345,"object":"event"}`)), http.StatusBadRequest, idemhttp.CodeKeyInvalid)
	wantCode(t, stripe.deliver("", []byte(`{"id":null}`)), http.StatusBadRequest, idemhttp.CodeKeyInvalid)
	wantCode(t, stripe.deliver("", []byte(`{"id":"evt_1",`)), http.StatusBadRequest, idemhttp.CodeInvalidJSON)
	if n := stripe.records(); n != 0 || stripe.calls.Load() != 0 {
		t.Fatalf("%d records, %d calls", n, stripe.calls.Load())
	}
	if got := fmt.Sprint(stripe.outcomes()); got != "[invalid invalid invalid invalid]" {
		t.Fatalf("outcomes %v", got)
	}

	gh := newEnv(t, fixtures[1], nil)
	r := signed(t, fixtures[1], fixtures[1].secrets[0], "d-1", event("x", 1), time.Now())
	r.Header.Del("X-GitHub-Delivery")
	wantCode(t, gh.send(r), http.StatusBadRequest, idemhttp.CodeKeyMissing)
	if n := gh.records(); n != 0 || gh.calls.Load() != 0 {
		t.Fatalf("%d records, %d calls", n, gh.calls.Load())
	}
}

// TestHandlerFailure: a handler error answers 500 and commits nothing, so
// the provider's retry runs the handler again; a permanent error does the
// same unless AcknowledgePermanent.
func TestHandlerFailure(t *testing.T) {
	t.Parallel()
	forProviders(t, func(t *testing.T, f fixture) {
		e := newEnv(t, f, nil)
		for _, err := range []error{errors.New("the stock service timed out"), retry.Permanent(errors.New("no such order"))} {
			e.setHook(func(context.Context, pgx.Tx, *webhook.Delivery) error { return err })
			wantCode(t, e.deliver("evt_f", event("evt_f", 1)), http.StatusInternalServerError, webhook.CodeHandlerFailed)
			if n := e.effects("evt_f"); n != 0 {
				t.Fatalf("%d effects committed by a failed handler", n)
			}
		}
		e.setHook(nil)
		wantAnswer(t, e.deliver("evt_f", event("evt_f", 1)), http.StatusOK, false)
		if n := e.effects("evt_f"); n != 1 || e.calls.Load() != 3 {
			t.Fatalf("%d effects, %d calls; want 1, 3", n, e.calls.Load())
		}
		if got := fmt.Sprint(e.outcomes()); got != "[retry retry processed]" {
			t.Fatalf("outcomes %v", got)
		}
	})
}

// TestAcknowledgePermanent: with AcknowledgePermanent, a permanent error is
// the event's stored answer (200 with the error), the handler's writes are
// undone, and duplicates get that answer without running it; a transient
// error still answers 500.
func TestAcknowledgePermanent(t *testing.T) {
	t.Parallel()
	forProviders(t, func(t *testing.T, f fixture) {
		e := newEnv(t, f, func(c *webhook.Config) { c.AcknowledgePermanent = true })
		e.setHook(func(context.Context, pgx.Tx, *webhook.Delivery) error {
			return retry.Permanent(errors.New("order o-1 does not exist"))
		})
		rec := e.deliver("evt_p", event("evt_p", 1))
		wantAnswer(t, rec, http.StatusOK, false)
		if want := `{"error":"order o-1 does not exist","status":"failed"}`; rec.Body.String() != want {
			t.Fatalf("answer %s, want %s", rec.Body, want)
		}
		wantAnswer(t, e.deliver("evt_p", event("evt_p", 1)), http.StatusOK, true)
		if n := e.effects("evt_p"); n != 0 || e.calls.Load() != 1 {
			t.Fatalf("%d effects, %d calls; want 0 (undone), 1", n, e.calls.Load())
		}
		e.setHook(func(context.Context, pgx.Tx, *webhook.Delivery) error { return errors.New("deadlock") })
		wantCode(t, e.deliver("evt_t", event("evt_t", 1)), http.StatusInternalServerError, webhook.CodeHandlerFailed)
		e.setHook(nil)
		wantAnswer(t, e.deliver("evt_t", event("evt_t", 1)), http.StatusOK, false)
		if n := e.effects("evt_t"); n != 1 {
			t.Fatalf("%d effects", n)
		}
		if got := fmt.Sprint(e.outcomes()); got != "[failed duplicate retry processed]" {
			t.Fatalf("outcomes %v", got)
		}
		n := e.logs.CountFunc("webhook: handler failed for good; acknowledged with the error stored", func(rec map[string]any) bool {
			return rec["level"] == "ERROR" && rec["event_id"] == "evt_p"
		})
		if n != 1 {
			t.Fatalf("%d ERROR lines for the acknowledged failure", n)
		}
	})
}

// TestProvidersScoped: two providers posting the same event ID to the same
// route each get their event applied.
func TestProvidersScoped(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t, migrated)
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	for _, f := range []fixture{fixtures[0], fixtures[3]} {
		s := newScheme(t, f, f.secrets[0])
		recv, err := webhook.New(db.Pool, &webhook.Config{Provider: f.name, Verify: s,
			HTTP: idemhttp.Config{Store: store, FingerprintKeys: testKeys}})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle("POST /hooks", recv.Handler(webhook.HandlerFunc(func(context.Context, pgx.Tx, *webhook.Delivery) error {
			calls.Add(1)
			return nil
		})))
		for range 2 {
			r := signed(t, f, f.secrets[0], "evt_same", event("evt_same", 1), time.Now())
			r.URL.Path = "/hooks"
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, r)
			if rec.Code != http.StatusOK {
				t.Fatalf("%s: %d %s", f.name, rec.Code, rec.Body)
			}
		}
	}
	if calls.Load() != 2 {
		t.Fatalf("%d handler calls, want one per provider", calls.Load())
	}
}

// TestNewValidates: New refuses what the receiver cannot work with.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	db := testenv.NewDB(t)
	s := newScheme(t, fixtures[2], fixtures[2].secrets[0])
	ok := func() *webhook.Config {
		return &webhook.Config{Provider: "stripe", Verify: s, HTTP: idemhttp.Config{FingerprintKeys: testKeys}}
	}
	if _, err := webhook.New(db.Pool, ok()); err != nil {
		t.Fatal(err)
	}
	for name, tweak := range map[string]func(*webhook.Config){
		"no provider":        func(c *webhook.Config) { c.Provider = "" },
		"upper-case":         func(c *webhook.Config) { c.Provider = "Stripe" },
		"space":              func(c *webhook.Config) { c.Provider = "my stripe" },
		"long provider":      func(c *webhook.Config) { c.Provider = strings.Repeat("p", webhook.MaxProviderLength+1) },
		"no verifier":        func(c *webhook.Config) { c.Verify = nil },
		"account":            func(c *webhook.Config) { c.HTTP.Account = func(*http.Request) (string, error) { return "a", nil } },
		"optional":           func(c *webhook.Config) { c.HTTP.Optional = true },
		"retryable":          func(c *webhook.Config) { c.HTTP.Retryable = idemhttp.RetryableDefault },
		"verifier, no key":   func(c *webhook.Config) { c.Verify = webhook.VerifierFunc(s.Verify) },
		"no fingerprint key": func(c *webhook.Config) { c.HTTP.FingerprintKeys = nil },
		"TTL under lease":    func(c *webhook.Config) { c.HTTP.TTL, c.HTTP.Lease = time.Second, time.Minute },
	} {
		c := ok()
		tweak(c)
		if _, err := webhook.New(db.Pool, c); !errors.Is(err, webhook.ErrInvalidConfig) && !errors.Is(err, idemhttp.ErrInvalidConfig) {
			t.Errorf("%s: New returned %v", name, err)
		}
	}
	if _, err := webhook.New(db.Pool, nil); !errors.Is(err, webhook.ErrInvalidConfig) {
		t.Errorf("nil config: %v", err)
	}
	c := ok()
	c.Verify = webhook.VerifierFunc(s.Verify)
	c.HTTP.Key = idemhttp.KeyFromJSON("id")
	if _, err := webhook.New(db.Pool, c); err != nil {
		t.Errorf("a Verifier with a Key: %v", err)
	}
}
