package dlq_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestRunErrorSaysDLQOnce: an error that stops a run names the package once.
func TestRunErrorSaysDLQOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.produce("x")
	e.consume(1, func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })
	_, err := e.reprocessor(dlq.Redrive, e.effect, func(c *dlq.ReprocessorConfig) {
		c.Tables = migrate.Tables{Schema: e.db.Schema, DLQReplays: "no_such_table"}
	}).Run(context.Background())
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("Run with a missing table: %v, want undefined_table", err)
	}
	if n := strings.Count(err.Error(), "dlq:"); n != 1 {
		t.Fatalf("error %q names dlq %d times, want once", err, n)
	}
}
