package idemhttp_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/migrate"
)

// A payment handler behind the middleware: its insert commits together with
// the idempotency record; a retry with the same key gets the stored answer.
func ExampleMiddleware() {
	pool, schema, drop := exampleDB() // a pgxpool.Pool and a migrated schema on the test server
	defer drop()

	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		panic(err)
	}
	// 32 random bytes or more, from your secret store and the same on every
	// process; crypto/rand makes one for this example.
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	mw, err := idemhttp.New(pool, &idemhttp.Config{
		Store: store,
		// The stored fingerprints are keyed with it (see FingerprintKeys).
		FingerprintKeys: [][]byte{secret},
		// Your authentication decides the principal; keys are scoped by it.
		Account: func(r *http.Request) (string, error) { return r.Header.Get("X-Account"), nil },
	})
	if err != nil {
		panic(err)
	}
	payments := pgx.Identifier{schema, "payments"}.Sanitize()
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p struct {
			OrderID string `json:"orderId"`
			Amount  int64  `json:"amount"`
		}
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		tx, _ := idemhttp.Tx(r.Context()) // commits with the record, or not at all
		var id int64
		if err := tx.QueryRow(r.Context(), "INSERT INTO "+payments+
			" (account, order_id, amount) VALUES ($1, $2, $3) RETURNING id",
			r.Header.Get("X-Account"), p.OrderID, p.Amount).Scan(&id); err != nil {
			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: rolled back, key released
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"payment":%d,"orderId":%q}`, id, p.OrderID)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(body string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		req.Header.Set("X-Account", "acct-1")
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), b)
		if !strings.HasSuffix(string(b), "\n") {
			fmt.Println()
		}
	}
	send(`{"orderId":"order-842","amount":10000,"currency":"BRL"}`)
	send(`{ "currency": "BRL", "amount": 1e4, "orderId": "order-842" }`) // same intent
	send(`{"orderId":"order-842","amount":25000,"currency":"BRL"}`)      // same key, other intent

	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+payments).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("payments:", n)
	// Output:
	// 201 replayed="" {"payment":1,"orderId":"order-842"}
	// 201 replayed="true" {"payment":1,"orderId":"order-842"}
	// 422 replayed="" {"error":{"code":"idempotency_key_reused","message":"this Idempotency-Key was used with a different request; use a new key for a new request"}}
	// payments: 1
}

func ExampleCanonicalJSON() {
	for _, in := range []string{
		`{"orderId":"order-842","amount":10000,"currency":"BRL"}`,
		`{ "currency" : "BRL", "amount" : 1.0e4, "orderId" : "order\u002d842" }`,
		`{"amount":0.0000001,"big":12345678901234567890123}`,
	} {
		out, err := idemhttp.CanonicalJSON([]byte(in))
		fmt.Println(string(out), err)
	}
	_, err := idemhttp.CanonicalJSON([]byte(`{"amount":1,"amount":2}`))
	fmt.Println(err)
	// Output:
	// {"amount":10000,"currency":"BRL","orderId":"order-842"} <nil>
	// {"amount":10000,"currency":"BRL","orderId":"order-842"} <nil>
	// {"amount":1e-7,"big":1.2345678901234567890123e+22} <nil>
	// idemhttp: invalid JSON at byte 23: duplicate member name "amount"
}

// A reconciler run on a schedule: records stuck past their lease are handed
// to it. Effects written in the middleware's transaction make AllowRetry safe.
func ExampleStore_Reconcile() {
	pool, schema, drop := exampleDB()
	defer drop()
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		panic(err)
	}
	n, err := store.Reconcile(context.Background(), pool, idemhttp.ReconcilerFunc(
		func(ctx context.Context, rec idemhttp.Record) (idemhttp.Decision, error) {
			// Ask the outside system when the effect left the database;
			// here every effect is in the transaction.
			return idemhttp.AllowRetry, nil
		}), idemhttp.FindLimitDefault)
	fmt.Println("settled:", n, err)
	// Output:
	// settled: 0 <nil>
}

// With Config.Wait, a retry that arrives while the first request is still
// running waits for it and gets its answer, instead of 409 at once.
func ExampleConfig_wait() {
	pool, schema, drop := exampleDB()
	defer drop()

	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		panic(err)
	}
	// 32 random bytes or more, from your secret store and the same on every
	// process; crypto/rand makes one for this example.
	secret := make([]byte, 32)
	_, _ = rand.Read(secret)
	mw, err := idemhttp.New(pool, &idemhttp.Config{
		Store:           store,
		FingerprintKeys: [][]byte{secret},
		Account:         func(*http.Request) (string, error) { return "acct-1", nil },
		Wait:            10 * time.Second, // woken when the first request commits
	})
	if err != nil {
		panic(err)
	}
	entered, proceed := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			close(entered)
			<-proceed // the first request is slow
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintln(w, "charged once")
	})))
	defer srv.Close()

	send := func(out chan<- string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "c1b7a1e2-5a2d-4a5e-9d53-0f3c1f4b2f10")
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- fmt.Sprintf("%d replayed=%q %s", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), b)
	}
	first, retry := make(chan string, 1), make(chan string, 1)
	go send(first)
	<-entered
	go send(retry) // waits for the first
	time.Sleep(100 * time.Millisecond)
	close(proceed)
	fmt.Print(<-first)
	fmt.Print(<-retry)
	fmt.Println("handler calls:", calls.Load())
	// Output:
	// 201 replayed="" charged once
	// 201 replayed="true" charged once
	// handler calls: 1
}
