package idemhttp_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// On a schema without the records table, the middleware answers 503
// store_unavailable and logs that the table is missing; every Store method
// returns an error matching ErrNotMigrated.
func TestNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t) // no migrations
	store, err := idemhttp.NewStore(&idemhttp.StoreConfig{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	mw, err := idemhttp.New(db.Pool, &idemhttp.Config{Store: store, Account: accountFromHeader, FingerprintKeys: testKeys,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		t.Error("the handler ran without a record")
	})))
	t.Cleanup(srv.Close)
	r, err := postTo(ctx, newClient(t), srv.URL+"/payments", newKey(), "acct-1", payment)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, r, http.StatusServiceUnavailable, idemhttp.CodeStoreUnavailable)
	if !strings.Contains(logs.String(), "schema not migrated") {
		t.Fatalf("the log does not say the table is missing:\n%s", logs.String())
	}

	_, err = store.Get(ctx, db.Pool, "acct-1", "POST /payments", "k")
	wantNotMigrated(t, "Get", err)
	_, err = store.FindStuck(ctx, db.Pool, 0)
	wantNotMigrated(t, "FindStuck", err)
	_, err = store.CountStuck(ctx, db.Pool)
	wantNotMigrated(t, "CountStuck", err)
	_, err = store.Reconcile(ctx, db.Pool, idemhttp.ReconcilerFunc(
		func(context.Context, idemhttp.Record) (idemhttp.Decision, error) { return idemhttp.AllowRetry, nil }), 0)
	wantNotMigrated(t, "Reconcile", err)
	_, err = store.Resolve(ctx, db.Pool, idemhttp.Record{Account: "acct-1", Operation: "POST /payments", Key: "k"},
		idemhttp.AllowRetry)
	wantNotMigrated(t, "Resolve", err)
	_, err = store.Purge(ctx, db.Pool, 0)
	wantNotMigrated(t, "Purge", err)
}

func wantNotMigrated(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, idemhttp.ErrNotMigrated) {
		t.Fatalf("%s on an unmigrated schema: %v, want ErrNotMigrated", what, err)
	}
}
