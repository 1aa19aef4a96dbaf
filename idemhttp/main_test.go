package idemhttp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// testKeys is the tests' Config.FingerprintKeys.
var testKeys = [][]byte{[]byte("idemhttp tests: a fingerprint secret of 32 bytes or more")}

// migrated is a testenv setup function: idemkit's migrations with default
// table names in the test's schema, plus the tests' business table.
func migrated(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return err
	}
	if _, err := m.Up(ctx); err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "payments"}.Sanitize()+` (
		id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		account  text   NOT NULL,
		order_id text   NOT NULL,
		amount   bigint NOT NULL
	)`) // no unique constraint on purpose: a duplicate effect must be visible
	return err
}

// clock is an injectable clock: real time plus an offset the test moves.
type clock struct {
	mu     sync.Mutex
	offset time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// logBuffer collects log output for assertions.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// env is one test's server: a migrated schema, a store on an injected
// clock, the middleware around the payments handler, and an HTTP server.
type env struct {
	t      *testing.T
	db     *testenv.DB
	clock  *clock
	store  *idemhttp.Store
	mw     *idemhttp.Middleware
	srv    *httptest.Server
	client *http.Client
	logs   *logBuffer
	hook   func(w http.ResponseWriter, r *http.Request) bool // before the insert; true: handled
	after  func(r *http.Request)                             // after the insert, before the response
	hookMu sync.Mutex
}

func (e *env) setHook(h func(w http.ResponseWriter, r *http.Request) bool) {
	e.hookMu.Lock()
	e.hook = h
	e.hookMu.Unlock()
}

func (e *env) getHook() func(w http.ResponseWriter, r *http.Request) bool {
	e.hookMu.Lock()
	defer e.hookMu.Unlock()
	return e.hook
}

// accountFromHeader is the tests' "authentication": the X-Account header.
func accountFromHeader(r *http.Request) (string, error) {
	if a := r.Header.Get("X-Account"); a != "" {
		return a, nil
	}
	return "", fmt.Errorf("no X-Account header")
}

// newEnv starts a server; tweak may change the Config before New.
func newEnv(t *testing.T, tweaks ...func(*idemhttp.Config)) *env {
	t.Helper()
	e := &env{t: t, db: testenv.NewDB(t, migrated), clock: &clock{}, logs: &logBuffer{}}
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: e.db.Schema}, Now: e.clock.Now})
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	e.store = store
	cfg := &idemhttp.Config{
		Store:           store,
		Account:         accountFromHeader,
		FingerprintKeys: testKeys,
		Logger:          slog.New(slog.NewTextHandler(e.logs, nil)),
	}
	for _, tweak := range tweaks {
		if tweak != nil {
			tweak(cfg)
		}
	}
	mw, err := idemhttp.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.mw = mw
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(e.createPayment)))
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	e.client = newClient(t)
	return e
}

// forModes runs f in parallel subtests, once per way a request holds its key
// in transaction mode: "lock" (the default: the key's advisory lock, the
// record written at completion) and "record" (NoLeaseTakeover: a PROCESSING
// record committed first).
func forModes(t *testing.T, f func(t *testing.T, mode func(*idemhttp.Config))) {
	t.Helper()
	for _, m := range []struct {
		name string
		mode func(*idemhttp.Config)
	}{
		{"lock", func(*idemhttp.Config) {}},
		{"record", func(c *idemhttp.Config) { c.NoLeaseTakeover = true }},
	} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			f(t, m.mode)
		})
	}
}

type paymentRequest struct {
	OrderID  string `json:"orderId"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

type paymentResponse struct {
	ID      int64  `json:"id"`
	Account string `json:"account"`
	OrderID string `json:"orderId"`
	Amount  int64  `json:"amount"`
}

// createPayment is the handler under test: it writes a payment row in the
// middleware's transaction and answers 201.
func (e *env) createPayment(w http.ResponseWriter, r *http.Request) {
	if h := e.getHook(); h != nil && h(w, r) {
		return
	}
	var req paymentRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	account, _ := accountFromHeader(r)
	ctx := r.Context()
	var db interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	} = e.db.Pool
	if tx, ok := idemhttp.Tx(ctx); ok {
		db = tx
	}
	var id int64
	if err := db.QueryRow(ctx, `INSERT INTO `+e.db.Table("payments")+` (account, order_id, amount)
		VALUES ($1, $2, $3) RETURNING id`, account, req.OrderID, req.Amount).Scan(&id); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if h := e.getAfter(); h != nil {
		h(r)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
	w.Header().Set("Set-Cookie", "session=secret")
	w.Header().Set("X-Debug", "not stored")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(paymentResponse{ID: id, Account: account, OrderID: req.OrderID, Amount: req.Amount})
}

func (e *env) setAfter(h func(r *http.Request)) {
	e.hookMu.Lock()
	e.after = h
	e.hookMu.Unlock()
}

func (e *env) getAfter() func(r *http.Request) {
	e.hookMu.Lock()
	defer e.hookMu.Unlock()
	return e.after
}

// payments counts the rows of the business table.
func (e *env) payments() int {
	e.t.Helper()
	var n int
	if err := e.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM "+e.db.Table("payments")).Scan(&n); err != nil {
		e.t.Fatalf("count payments: %v", err)
	}
	return n
}

type response struct {
	status int
	header http.Header
	body   string
}

func (r response) replayed() bool { return r.header.Get(idemhttp.HeaderReplayed) == "true" }

// code returns the error code of a middleware error body, or "".
func (r response) code() string {
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(r.body), &e)
	return e.Error.Code
}

func (r response) String() string {
	return fmt.Sprintf("%d replayed=%v %q", r.status, r.replayed(), r.body)
}

// post sends a POST /payments with the given key (none if empty), account
// and body.
func (e *env) post(key, account, body string) response {
	e.t.Helper()
	r, err := e.tryPost(context.Background(), key, account, body)
	if err != nil {
		e.t.Fatalf("POST /payments: %v", err)
	}
	return r
}

func (e *env) tryPost(ctx context.Context, key, account, body string) (response, error) {
	return postTo(ctx, e.client, e.srv.URL+"/payments", key, account, body)
}

// newClient returns a client whose connections are closed when the test
// ends, so that no connection goroutine outlives the tests.
func newClient(t *testing.T) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func postTo(ctx context.Context, client *http.Client, url, key, account, body string) (response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	if account != "" {
		req.Header.Set("X-Account", account)
	}
	return do(client, req)
}

// do sends req and reads the whole response.
func do(client *http.Client, req *http.Request) (response, error) {
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

func newKey() string { return rand.Text() }

const payment = `{"orderId":"order-842","amount":10000,"currency":"BRL"}`

func want(t *testing.T, r response, status int, replayed bool) {
	t.Helper()
	if r.status != status || r.replayed() != replayed {
		t.Fatalf("got %v, want status %d replayed=%v", r, status, replayed)
	}
}

func wantError(t *testing.T, r response, status int, code string) {
	t.Helper()
	if r.status != status || r.code() != code {
		t.Fatalf("got %v, want status %d code %s", r, status, code)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("error Content-Type = %q, want application/json", ct)
	}
}

func wantPayments(t *testing.T, e *env, n int) {
	t.Helper()
	if got := e.payments(); got != n {
		t.Fatalf("payments = %d, want %d", got, n)
	}
}

// exampleDB returns, for Example functions (which get no testing.TB), a pool
// on the test server with an empty search_path and a fresh migrated schema;
// drop removes the schema and closes the pool.
func exampleDB() (pool *pgxpool.Pool, schema string, drop func()) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv(testenv.EnvDatabaseURL))
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	schema = "ex_" + strings.ToLower(rand.Text()[:12])
	drop = func() {
		defer pool.Close()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			panic(err)
		}
	}
	if err := migrated(ctx, pool, schema); err != nil {
		drop()
		panic(err)
	}
	return pool, schema, drop
}
