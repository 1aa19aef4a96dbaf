package dedup_test

import (
	"context"
	"crypto/rand"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// migrated is a testenv setup function: idemkit's migrations with default
// table names in the test's schema.
func migrated(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	m, err := migrate.New(pool, &migrate.Config{Schema: schema})
	if err != nil {
		return err
	}
	_, err = m.Up(ctx)
	return err
}

// newStore returns a migrated schema and a Store on it.
func newStore(t *testing.T) (*testenv.DB, *dedup.Store) {
	t.Helper()
	db := testenv.NewDB(t, migrated)
	s, err := dedup.New(&dedup.Config{Schema: db.Schema})
	if err != nil {
		t.Fatalf("dedup.New: %v", err)
	}
	return db, s
}

// exampleDB returns, for Example functions (which get no testing.TB), a pool
// on the test server with an empty search_path and a fresh migrated schema; drop
// removes the schema and closes the pool.
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

// count scans the single integer a query returns.
func count(t *testing.T, q dedup.DBTX, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := q.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// inTx runs fn in a transaction on pool and commits it.
func inTx(t *testing.T, pool *pgxpool.Pool, fn func(tx pgx.Tx)) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	fn(tx)
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit: %v", err)
	}
}
