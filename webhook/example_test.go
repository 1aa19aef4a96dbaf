package webhook_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/webhook"
)

// A Stripe endpoint: each event's effect commits with its record, a retry
// of the event gets the stored answer, a delivery signed with another
// secret gets 401.
func ExampleNew() {
	pool, schema, drop := exampleDB() // a pgxpool.Pool and a migrated schema on the test server
	defer drop()
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		panic(err)
	}
	// The endpoint's signing secret, as the provider's dashboard shows it;
	// during a rotation, list the new one and the old one.
	stripe, err := webhook.Stripe("whsec_example0endpoint0signing0secret")
	if err != nil {
		panic(err)
	}
	// 32 random bytes or more, from your secret store and the same on every
	// process; crypto/rand makes one for this example.
	fingerprintKey := make([]byte, 32)
	_, _ = rand.Read(fingerprintKey)
	receiver, err := webhook.New(pool, &webhook.Config{
		Provider: "stripe", // the scope of the event IDs
		Verify:   stripe,   // the event ID is the "id" of Stripe's JSON body
		HTTP:     idemhttp.Config{Store: store, FingerprintKeys: [][]byte{fingerprintKey}},
	})
	if err != nil {
		panic(err)
	}
	payments := pgx.Identifier{schema, "payments"}.Sanitize()
	mux := http.NewServeMux()
	mux.Handle("POST /webhooks/stripe", receiver.Handler(webhook.HandlerFunc(
		func(ctx context.Context, tx pgx.Tx, d *webhook.Delivery) error {
			var ev struct {
				Data struct {
					Object struct {
						ID     string `json:"id"`
						Amount int64  `json:"amount"`
					} `json:"object"`
				} `json:"data"`
			}
			if err := json.Unmarshal(d.Body, &ev); err != nil {
				return err
			}
			// Commits with the event's record, or not at all.
			_, err := tx.Exec(ctx, "INSERT INTO "+payments+" (event_id, intent, amount) VALUES ($1, $2, $3)",
				d.ID, ev.Data.Object.ID, ev.Data.Object.Amount)
			return err
		})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	event := `{"id":"evt_3PqA1b2C3d4E5f6G","object":"event","type":"payment_intent.succeeded",` +
		`"data":{"object":{"id":"pi_3PqA1b","object":"payment_intent","amount":2000}}}`
	deliver := func(signer *webhook.Scheme) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/webhooks/stripe", strings.NewReader(event))
		req.Header.Set("Content-Type", "application/json")
		_ = signer.Sign(req.Header, []byte(event), time.Now()) // what Stripe sends
		resp, err := srv.Client().Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), strings.TrimSpace(string(b)))
	}
	deliver(stripe)
	deliver(stripe) // Stripe's retry
	forger, _ := webhook.Stripe("whsec_a0secret0the0receiver0does0not0know")
	deliver(forger)

	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+payments).Scan(&n); err != nil {
		panic(err)
	}
	fmt.Println("payments:", n)
	// Output:
	// 200 replayed="" {"status":"processed"}
	// 200 replayed="true" {"status":"processed"}
	// 401 replayed="" {"error":{"code":"signature_invalid","message":"the delivery's signature was not verified"}}
	// payments: 1
}

// exampleDB returns, for Example functions (which get no testing.TB), a pool
// on the test server with an empty search_path and a fresh migrated schema
// with a payments table; drop removes the schema and closes the pool.
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
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err == nil {
		_, err = m.Up(ctx)
	}
	if err == nil {
		_, err = pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "payments"}.Sanitize()+` (
			event_id text PRIMARY KEY, intent text NOT NULL, amount bigint NOT NULL)`)
	}
	if err != nil {
		drop()
		panic(err)
	}
	return pool, schema, drop
}
