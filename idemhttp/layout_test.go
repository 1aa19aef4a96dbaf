package idemhttp_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// A first request writes its record once: in the default layout
// one INSERT of the COMPLETED record with COMMIT and no UPDATE; with a
// record of its own (NoLeaseTakeover) the completion changes no indexed
// column, so PostgreSQL makes it a HOT update. The middleware runs on a
// pool of one connection, so that this test knows which backend's
// statistics to wait for.
func TestCompletionIsHOT(t *testing.T) {
	t.Parallel()
	t.Run("lock", func(t *testing.T) { t.Parallel(); testCompletionWrites(t, false) })
	t.Run("record", func(t *testing.T) { t.Parallel(); testCompletionWrites(t, true) })
}

func testCompletionWrites(t *testing.T, record bool) {
	ctx := context.Background()
	db := testenv.NewDB(t, migrated)
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(pool, &idemhttp.Config{Store: store, Account: accountFromHeader, FingerprintKeys: testKeys,
		NoLeaseTakeover: record, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, _ := idemhttp.Tx(r.Context())
		if _, err := tx.Exec(r.Context(), "INSERT INTO "+db.Table("payments")+
			" (account, order_id, amount) VALUES ('acct-1', 'o', 1)"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"ok":true}`))
	})))
	t.Cleanup(srv.Close)
	client := newClient(t)
	const n = 5
	for range n {
		r, err := postTo(ctx, client, srv.URL+"/payments", newKey(), "acct-1", payment)
		if err != nil {
			t.Fatal(err)
		}
		want(t, r, http.StatusCreated, false)
	}
	// The pool's one backend ran every completion. A backend sends its
	// statistics at the end of a transaction, at most every half second (14)
	// or second (15 on), so they reach pg_stat_user_tables late. One more
	// insert into payments on that backend marks the end: its counts travel
	// with (or after) every count of the records, so once payments shows
	// n+1 inserts the records' counts are complete. Each read on the backend
	// ends a transaction, which sends what is pending once the interval has
	// passed. (pg_stat_force_next_flush would do it at once, but PostgreSQL
	// 14 has none.)
	if _, err := pool.Exec(ctx, "INSERT INTO "+db.Table("payments")+
		" (account, order_id, amount) VALUES ('acct-sentinel', 'o', 1)"); err != nil {
		t.Fatal(err)
	}
	var ins, upd, hot, marks int64
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := pool.QueryRow(ctx, `SELECT r.n_tup_ins, r.n_tup_upd, r.n_tup_hot_upd, p.n_tup_ins
			FROM pg_catalog.pg_stat_user_tables r, pg_catalog.pg_stat_user_tables p
			WHERE r.relid = $1::regclass AND p.relid = $2::regclass`,
			db.Table("idempotency_records"), db.Table("payments")).Scan(&ins, &upd, &hot, &marks); err != nil {
			t.Fatal(err)
		}
		if marks == n+1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pg_stat_user_tables shows %d inserts into payments after 30s, want %d: the statistics did not arrive", marks, n+1)
		}
		time.Sleep(50 * time.Millisecond)
	}
	wantUpd := int64(0)
	if record {
		wantUpd = n
	}
	if ins != n || upd != wantUpd || hot != wantUpd {
		t.Fatalf("%d inserts and %d updates of the records, %d of them HOT; want %d, %d and %d",
			ins, upd, hot, n, wantUpd, wantUpd)
	}
}

// Purge walks the whole table by ranges of pages (no index since migration
// 13): on a table of many pages, with expired and live records mixed on
// every page and more expired records per range than one statement
// deletes, it deletes exactly the expired ones.
func TestPurgeWalksTheTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t)
	records := e.db.Table(migrate.IdempotencyRecordsDefault)
	now := e.clock.Now()
	const n = 12000
	// Every third record is live; the others expired an hour ago.
	if _, err := e.db.Pool.Exec(ctx, `INSERT INTO `+records+` (account, operation, idempotency_key, fingerprint,
		state, token, response_status, response_headers, response_body, created_at, updated_at, completed_at, expires_at)
		SELECT 'acct-1', 'POST /payments', 'k' || i, '\x00', 'COMPLETED', i, 201, '{}', 'body', $1, $1, $1,
			CASE WHEN i % 3 = 0 THEN $1::timestamptz + interval '1 hour' ELSE $1::timestamptz - interval '1 hour' END
		FROM generate_series(1, $2::int) AS i`, now, n); err != nil {
		t.Fatal(err)
	}
	var pages int64
	if err := e.db.Pool.QueryRow(ctx, `SELECT pg_catalog.pg_relation_size($1::regclass) / 8192`, records).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if pages < 3*64 {
		t.Fatalf("the table has %d pages; the test needs several ranges of 64", pages)
	}
	deleted, err := e.store.Purge(ctx, e.db.Pool, 50)
	if err != nil || deleted != n-n/3 {
		t.Fatalf("Purge = %d, %v; want %d", deleted, err, n-n/3)
	}
	var left, live int
	if err := e.db.Pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE expires_at > $1) FROM `+records, now).
		Scan(&left, &live); err != nil || left != n/3 || live != n/3 {
		t.Fatalf("records left = %d (%d live), %v; want %d, all live", left, live, err, n/3)
	}
}
