package dedup_test

import (
	"context"
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
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
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
	s, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatalf("dedup.New: %v", err)
	}
	return db, s
}

// exampleDB returns a pool on the test server and a fresh migrated schema;
// drop removes it.
func exampleDB() (pool *pgxpool.Pool, schema string, drop func()) {
	pool, schema, drop = testenv.ExampleSchema()
	if err := migrated(context.Background(), pool, schema); err != nil {
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
