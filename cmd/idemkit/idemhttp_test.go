package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

func TestIdemhttpStuck(t *testing.T) {
	ctx := context.Background()
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
		if err == nil {
			_, err = m.Up(ctx)
		}
		return err
	})
	records := db.Table(migrate.IdempotencyRecordsDefault)
	now := time.Now()
	for key, lease := range map[string]time.Time{"overdue-key": now.Add(-time.Minute), "fresh-key": now.Add(time.Minute)} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO `+records+` (account, operation, idempotency_key, fingerprint,
			state, token, locked_until, created_at, updated_at, expires_at)
			VALUES ('acct-1', 'POST /payments', $1, '\x00', 'PROCESSING', 7, $2, $3, $3, $4)`,
			key, lease, now.Add(-2*time.Minute), now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"idemhttp", "stuck", "-database", testenv.DatabaseURL(t), "-schema", db.Schema}, &out); err != nil {
		t.Fatalf("idemhttp stuck: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), `"overdue-key"`) || strings.Contains(out.String(), "fresh-key") ||
		!strings.Contains(out.String(), "1 stuck record(s)") {
		t.Fatalf("output:\n%s", out.String())
	}
	if err := run(ctx, []string{"idemhttp", "stuck", "extra"}, &out); err == nil {
		t.Fatal("a positional argument was accepted")
	}
	bare := testenv.NewDB(t) // not migrated
	err := run(ctx, []string{"idemhttp", "stuck", "-database", testenv.DatabaseURL(t), "-schema", bare.Schema}, &out)
	if !errors.Is(err, idemhttp.ErrNotMigrated) {
		t.Fatalf("idemhttp stuck on an unmigrated schema: %v, want ErrNotMigrated", err)
	}
}
