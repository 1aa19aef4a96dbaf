package migrate_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// exampleDB returns a pool on the test server and the name of a schema that
// does not exist yet; drop removes it.
func exampleDB() (*pgxpool.Pool, string, func()) { return testenv.ExampleSchema() }

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
