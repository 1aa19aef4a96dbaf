package migrate_test

import (
	"context"
	"crypto/rand"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// exampleDB returns, for Example functions (which get no testing.TB), a pool
// on the test server with an empty search_path and the name of a schema that does
// not exist yet; drop removes the schema and closes the pool.
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
	return pool, schema, func() {
		defer pool.Close()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			panic(err)
		}
	}
}

// dropSchemaAtCleanup drops a schema the test made outside testenv.NewDB.
func dropSchemaAtCleanup(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	t.Cleanup(func() {
		if _, err := pool.Exec(context.Background(),
			"DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
}
