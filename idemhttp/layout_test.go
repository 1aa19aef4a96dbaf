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
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// A completion within the lease changes no indexed column: PostgreSQL makes
// it a HOT update (issue 17). The middleware runs on a pool of one
// connection, so that this test can flush that backend's statistics.
func TestCompletionIsHOT(t *testing.T) {
	t.Parallel()
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
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Schema: db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(pool, &idemhttp.Config{Store: store, Account: accountFromHeader,
		Logger: slog.New(slog.DiscardHandler)})
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
	// The pool's one backend ran every completion: flush its statistics,
	// then read them in a new transaction on it.
	if _, err := pool.Exec(ctx, "SELECT pg_catalog.pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	var upd, hot int64
	if err := pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_catalog.pg_stat_user_tables
		WHERE relid = $1::regclass`, db.Table("idempotency_records")).Scan(&upd, &hot); err != nil {
		t.Fatal(err)
	}
	if upd != n || hot != n {
		t.Fatalf("%d updates of the records, %d of them HOT; want %d and %d", upd, hot, n, n)
	}
}

// Migration 11 keeps the records written before it: a completed record
// still replays, a record whose holder crashed is still listed by FindStuck
// and taken over; reverting it brings version 3's index back.
func TestUpgradeKeepsRecords(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, func(c *idemhttp.Config) { c.Lease = 30 * time.Second })
	m, err := migrate.New(e.db.Pool, &migrate.Config{Schema: e.db.Schema})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Down(ctx, 10); err != nil {
		t.Fatalf("Down(10): %v", err)
	}
	records := e.db.Table(migrate.IdempotencyRecordsDefault)
	layout := func(when string, wantStuckIdx bool, wantFillfactor string) {
		t.Helper()
		rows, err := e.db.Pool.Query(ctx, `SELECT c.relname FROM pg_catalog.pg_index i
			JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass`, records)
		if err != nil {
			t.Fatal(err)
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if has := slices.ContainsFunc(names, func(n string) bool { return strings.HasSuffix(n, "_stuck_idx") }); has != wantStuckIdx || len(names) != 2+boolInt(wantStuckIdx) {
			t.Fatalf("%s: indexes %v, want the stuck index: %v", when, names, wantStuckIdx)
		}
		var opts []string
		if err := e.db.Pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_catalog.pg_class
			WHERE oid = $1::regclass`, records).Scan(&opts); err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(opts, ","); got != wantFillfactor {
			t.Fatalf("%s: reloptions %q, want %q", when, got, wantFillfactor)
		}
	}
	layout("at version 10", true, "")

	done, stuck := newKey(), newKey()
	first := e.post(done, "acct-1", payment)
	want(t, first, http.StatusCreated, false)
	e.crashed(stuck, "acct-1", payment) // one more payment: the fingerprint's donor
	wantPayments(t, e, 2)

	if applied, err := m.Up(ctx); err != nil || !slices.Equal(applied, []int{11, 12}) {
		t.Fatalf("Up = %v, %v; want [11 12]", applied, err)
	}
	layout("at version 11", false, "fillfactor=70")
	r := e.post(done, "acct-1", payment)
	want(t, r, http.StatusCreated, true)
	if r.body != first.body {
		t.Fatalf("replay after the upgrade %v, want %v", r, first)
	}
	found, err := e.store.FindStuck(ctx, e.db.Pool, 0)
	if err != nil || len(found) != 1 || found[0].Key != stuck || found[0].Token != deadToken {
		t.Fatalf("FindStuck after the upgrade = %+v, %v; want the crashed record", found, err)
	}
	want(t, e.post(stuck, "acct-1", payment), http.StatusCreated, false) // taken over
	wantPayments(t, e, 3)

	if reverted, err := m.Down(ctx, 10); err != nil || !slices.Equal(reverted, []int{12, 11}) {
		t.Fatalf("Down(10) = %v, %v; want [12 11]", reverted, err)
	}
	layout("reverted to version 10", true, "")
	want(t, e.post(done, "acct-1", payment), http.StatusCreated, true)
	want(t, e.post(stuck, "acct-1", payment), http.StatusCreated, true)
	wantPayments(t, e, 3)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
