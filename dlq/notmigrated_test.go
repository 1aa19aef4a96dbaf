package dlq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/retry"
)

// A replay against a schema without the replay records table stops with
// ErrNotMigrated (also idemkit.ErrNotMigrated), not a raw SQLSTATE, and
// changes nothing.
func TestReprocessorNotMigrated(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.produce("nm")
	e.consume(1, func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })
	empty := e.db.Schema + "_empty"
	ctx := context.Background()
	if _, err := e.db.Pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{empty}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.db.Pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{empty}.Sanitize()+" CASCADE")
	})
	r := e.reprocessor(dlq.Republish, nil, func(c *dlq.ReprocessorConfig) { c.Tables.Schema = empty })
	_, err := r.Run(ctx)
	if !errors.Is(err, dlq.ErrNotMigrated) || !errors.Is(err, idemkit.ErrNotMigrated) {
		t.Fatalf("Run on an empty schema = %v, want dlq.ErrNotMigrated and idemkit.ErrNotMigrated", err)
	}
	if n := len(e.deadLetters()); n != 1 {
		t.Fatalf("%d dead letters, want 1 (nothing written back)", n)
	}
}
