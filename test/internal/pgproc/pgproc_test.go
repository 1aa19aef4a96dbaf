package pgproc_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/pgproc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestServer: a private server keeps fsync'ed commits through an immediate
// restart, refuses connections while stopped (a connection-class error), and
// comes back on the same URL after a fast stop and a start.
func TestServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := pgproc.Start(t)

	exec := func(sql string) error {
		conn, err := pgx.Connect(ctx, s.URL())
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec(`CREATE TABLE t (n int PRIMARY KEY); INSERT INTO t VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	if err := s.Restart(ctx, pgproc.Immediate); err != nil {
		t.Fatal(err)
	}
	// The connection opened before the restart is gone.
	if _, err := conn.Exec(ctx, `SELECT 1`); err == nil || !retry.IsConnection(err) {
		t.Fatalf("a connection across an immediate restart: %v, want a connection-class error", err)
	}
	if err := exec(`INSERT INTO t VALUES (2)`); err != nil {
		t.Fatalf("after an immediate restart: %v", err)
	}

	if err := s.Stop(ctx, pgproc.Fast); err != nil {
		t.Fatal(err)
	}
	err = exec(`SELECT 1`)
	var connectErr *pgconn.ConnectError
	if !errors.As(err, &connectErr) || !retry.IsConnection(err) {
		t.Fatalf("while stopped: %v, want a connect error", err)
	}
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	conn2, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(context.WithoutCancel(ctx))
	if err := conn2.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("rows after the restarts: %d, %v; want 2", n, err)
	}
	var fsync string
	if err := conn2.QueryRow(ctx, `SHOW fsync`).Scan(&fsync); err != nil || fsync != "on" {
		t.Fatalf("fsync = %q, %v; want on", fsync, err)
	}
}
