package pgsession_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

func show(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name string) string {
	t.Helper()
	var v string
	if err := db.QueryRow(context.Background(), "SELECT pg_catalog.current_setting($1)", name).Scan(&v); err != nil {
		t.Fatalf("current_setting(%s): %v", name, err)
	}
	return v
}

func TestBeginQueryBoundsTheTransactionOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	before := show(t, conn, "idle_in_transaction_session_timeout")
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: pgsession.BeginQuery("READ COMMITTED", 5*time.Second)})
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	if got := show(t, tx, "idle_in_transaction_session_timeout"); got != "15s" {
		t.Fatalf("in the transaction: %s, want 15s (5s + Margin)", got)
	}
	if got := show(t, tx, "transaction_isolation"); got != "read committed" {
		t.Fatalf("isolation %s", got)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := show(t, conn, "idle_in_transaction_session_timeout"); got != before {
		t.Fatalf("after commit: %s, want the session's %s", got, before)
	}
}

func TestSessionAndCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "0"
	cfg.ConnConfig.RuntimeParams["tcp_keepalives_idle"] = "0"
	cfg.ConnConfig.ConnectTimeout = 0
	bare, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	logs, log := testenv.NewLogs(t)
	off := pgsession.Check(ctx, bare, &bare.Config().ConnConfig.Config, log, "test")
	if !slices.Equal(off, []string{"connect_timeout", "idle_in_transaction_session_timeout", "tcp_keepalives_idle"}) {
		t.Fatalf("Check on a pool without bounds = %v", off)
	}
	if n := logs.Count(pgsession.WarnMsg, ""); n != 1 {
		t.Fatalf("%d warnings, want 1", n)
	}
	if n := logs.Count(pgsession.DialWarnMsg, ""); n != 1 {
		t.Fatalf("%d warnings about connect_timeout, want 1", n)
	}

	cfg = cfg.Copy()
	cfg.AfterConnect = pgsession.AfterConnect(20 * time.Second)
	cfg.ConnConfig.DialFunc = pgsession.Dialer(5 * time.Second).DialContext
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	bounded, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer bounded.Close()
	for name, want := range map[string]string{"idle_in_transaction_session_timeout": "30s", "tcp_keepalives_idle": "15",
		"tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"} {
		if got := show(t, bounded, name); got != want {
			t.Fatalf("%s = %s after AfterConnect, want %s", name, got, want)
		}
	}
	if off := pgsession.Check(ctx, bounded, &bounded.Config().ConnConfig.Config, log, "test"); len(off) != 0 {
		t.Fatalf("Check on a bounded pool = %v", off)
	}
	if n := logs.Count(pgsession.WarnMsg, "") + logs.Count(pgsession.DialWarnMsg, ""); n != 2 {
		t.Fatalf("%d warnings, want still 2", n)
	}

	conn, err := bounded.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := pgsession.SetSession(ctx, conn.Conn(), time.Second, 1500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := show(t, conn, "idle_session_timeout"); got != "1500ms" {
		t.Fatalf("idle_session_timeout = %s", got)
	}
	if got := show(t, conn, "idle_in_transaction_session_timeout"); got != "11s" {
		t.Fatalf("idle_in_transaction_session_timeout = %s", got)
	}
	conn.Conn().Close(ctx) // its settings must not go back to the pool
}
