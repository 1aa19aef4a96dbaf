package dlq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

// TestRedriveTransactionIsBounded: a redrive's handler runs within
// HandlerTimeout, in a transaction the server ends if it sits idle for
// HandlerTimeout plus the margin; Run warns once that the pool's own
// sessions leave abandoned transactions open.
func TestRedriveTransactionIsBounded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.produce("b0")
	e.consume(1, func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })
	logs, log := testenv.NewLogs(t)
	var (
		setting string
		left    time.Duration
		hasDL   bool
	)
	h := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		var dl time.Time
		dl, hasDL = ctx.Deadline()
		left = time.Until(dl)
		if err := tx.QueryRow(ctx, "SELECT pg_catalog.current_setting('idle_in_transaction_session_timeout')").Scan(&setting); err != nil {
			return err
		}
		return e.effect(ctx, tx, m)
	}
	sum, err := e.reprocessor(dlq.Redrive, h, func(c *dlq.ReprocessorConfig) {
		c.HandlerTimeout = 5 * time.Second
		c.Logger = log
	}).Run(context.Background())
	if err != nil || sum.Records[dlq.Applied] != 1 {
		t.Fatalf("Run = %v, %v; want one applied", sum, err)
	}
	if !hasDL || left > 5*time.Second {
		t.Fatalf("the handler's context: deadline %v, %v left; want at most HandlerTimeout (5s)", hasDL, left)
	}
	if setting != "15s" {
		t.Fatalf("idle_in_transaction_session_timeout in the redrive's transaction = %q, want 15s (HandlerTimeout + margin)", setting)
	}
	if n := logs.Count(pgsession.WarnMsg, ""); n != 1 {
		t.Fatalf("%d warnings about the pool's sessions, want 1", n)
	}
}

// TestRedriveHandlerOutOfTime: a handler whose statement outlasts
// HandlerTimeout failed (pgx closes the connection under the statement at
// the deadline): the replay counts it and goes on, rather than waiting for
// an outage that is none.
func TestRedriveHandlerOutOfTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	e.produce("s0")
	e.consume(1, func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })
	slow := func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		_, err := tx.Exec(ctx, "SELECT pg_catalog.pg_sleep(30)")
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := e.reprocessor(dlq.Redrive, slow, func(c *dlq.ReprocessorConfig) {
		c.HandlerTimeout = 200 * time.Millisecond
	}).Run(ctx)
	if err != nil || sum.Records[dlq.FailedAgain] != 1 {
		t.Fatalf("Run = %v, %v; want the dead letter failed again", sum, err)
	}
}
