package idemtest_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/idemtest"
	"github.com/idemkit/idemkit/migrate"
)

// payments is a test's schema with a table of charges per payment.
type payments struct {
	pool    *pgxpool.Pool
	schema  *idemtest.Schema
	store   *dedup.Store
	charges string
}

func newPayments(t *testing.T) *payments {
	t.Helper()
	pool := newPool(t)
	s := idemtest.NewSchema(t, pool)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		t.Fatal(err)
	}
	p := &payments{pool: pool, schema: s, store: store, charges: s.Table("charges")}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE `+p.charges+` (id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return p
}

// charge is the business write, in the consumer's transaction.
func (p *payments) charge(ctx context.Context, tx pgx.Tx, id string) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+p.charges+` (id, n) VALUES ($1, 1)
		ON CONFLICT (id) DO UPDATE SET n = `+p.charges+`.n + 1`, id)
	return err
}

// total is the effect: every charge made, committed.
func (p *payments) total(ctx context.Context) (int, error) {
	var n int
	err := p.pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0)::int FROM `+p.charges).Scan(&n)
	return n, err
}

func payment(id string, offset int64) kafka.Message {
	return kafka.Message{Offset: offset, Key: []byte("acct-1"), Value: []byte(id),
		Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}
}

// TestCorrectHandlerPasses: a handler whose only write is in the consumer's
// transaction passes every helper, per message and in batches, at every
// crash point; the kit reports nothing.
func TestCorrectHandlerPasses(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			t.Parallel()
			p := newPayments(t)
			cfg := &consumer.Config{Store: p.store, Name: "billing"}
			if batch {
				cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
					for _, m := range msgs {
						if err := p.charge(ctx, tx, m.ID); err != nil {
							return err
						}
					}
					return nil
				})
			} else {
				cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					return p.charge(ctx, tx, m.ID)
				})
			}
			c, err := idemtest.NewConsumer(p.pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := t.Context()
			f := report(t, func(tb testing.TB) {
				idemtest.RequireIdempotent(ctx, tb, c, payment("pay-1", 10), p.total)
				idemtest.RequireIdempotentBatch(ctx, tb, c, payment("pay-2", 20), p.total)
				for i, crash := range idemtest.CrashPoints() {
					idemtest.RequireRecovers(ctx, tb, c, crash, payment(fmt.Sprintf("pay-crash-%d", i), int64(30+i)), p.total)
				}
			})
			requireClean(t, f)
			if n, err := p.total(ctx); err != nil || n != 2+len(idemtest.CrashPoints()) {
				t.Fatalf("charges %d, %v; want one per payment, %d", n, err, 2+len(idemtest.CrashPoints()))
			}
			if got := c.Calls("pay-1"); got != 1 {
				t.Fatalf("Calls(pay-1) = %d, want 1", got)
			}
			// The crash in the handler happened with the handler called.
			if got := c.Calls("pay-crash-0"); got != 2 {
				t.Fatalf("Calls(pay-crash-0) = %d, want 2 (the crashed call and the redelivery)", got)
			}
		})
	}
}

// TestCatchesNonIdempotentHandlers: the kit reports handlers whose effect
// is not tied to the claimed transaction, and an ID that a producer retry
// changes.
func TestCatchesNonIdempotentHandlers(t *testing.T) {
	t.Parallel()

	t.Run("counter in memory", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t)
		var sent atomic.Int64 // e.g. e-mails sent: outside the transaction
		c, err := idemtest.NewConsumer(p.pool, &consumer.Config{Store: p.store,
			Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				sent.Add(1)
				return p.charge(ctx, tx, m.ID)
			})})
		if err != nil {
			t.Fatal(err)
		}
		effect := func(context.Context) (int64, error) { return sent.Load(), nil }
		// Deliveries that commit cannot see it ...
		requireClean(t, report(t, func(tb testing.TB) {
			idemtest.RequireIdempotent(t.Context(), tb, c, payment("pay-1", 1), effect)
		}))
		// ... a crash before the commit does.
		f := report(t, func(tb testing.TB) {
			idemtest.RequireRecovers(t.Context(), tb, c, idemtest.CrashBeforeCommit, payment("pay-2", 2), effect)
		})
		requireReported(t, f, "after a crash before commit the effect is 2, want 1", "outside")
	})

	t.Run("autocommit statement on the pool", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t)
		stats := p.schema.Table("stats")
		if _, err := p.pool.Exec(t.Context(), `CREATE TABLE `+stats+` (charged int NOT NULL); INSERT INTO `+stats+` VALUES (0)`); err != nil {
			t.Fatal(err)
		}
		c, err := idemtest.NewConsumer(p.pool, &consumer.Config{Store: p.store,
			Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				if err := p.charge(ctx, tx, m.ID); err != nil {
					return err
				}
				// Wrong: p.pool, not tx. This commits on its own.
				_, err := p.pool.Exec(ctx, `UPDATE `+stats+` SET charged = charged + 1`)
				return err
			})})
		if err != nil {
			t.Fatal(err)
		}
		effect := func(ctx context.Context) (int, error) {
			var n int
			return n, p.pool.QueryRow(ctx, `SELECT charged FROM `+stats).Scan(&n)
		}
		f := report(t, func(tb testing.TB) {
			idemtest.RequireRecovers(t.Context(), tb, c, idemtest.CrashInHandler, payment("pay-1", 1), effect)
		})
		requireReported(t, f, "after a crash in the handler the effect is 1, want 0")
		if f.fatal {
			t.Fatalf("the kit stopped instead of reporting and going on")
		}
	})

	t.Run("ID from coordinates", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t)
		c, err := idemtest.NewConsumer(p.pool, &consumer.Config{Store: p.store,
			MissingID: consumer.MissingIDUseCoordinates,
			Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				return p.charge(ctx, tx, string(m.Value))
			})})
		if err != nil {
			t.Fatal(err)
		}
		msg := kafka.Message{Offset: 5, Value: []byte("pay-1")} // no message-id header
		f := report(t, func(tb testing.TB) { idemtest.RequireIdempotent(t.Context(), tb, c, msg, p.total) })
		requireReported(t, f, "producer retry", "offset (an ID from coordinates?)", "after a producer retry of offset 5 the effect is 2, want 1")
	})

	t.Run("effect that reads nothing", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t)
		c, err := idemtest.NewConsumer(p.pool, &consumer.Config{Store: p.store,
			Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error { return nil })})
		if err != nil {
			t.Fatal(err)
		}
		f := report(t, func(tb testing.TB) {
			idemtest.RequireIdempotent(t.Context(), tb, c, payment("pay-1", 1), p.total)
		})
		requireReported(t, f, "proves nothing")
	})

	t.Run("ID already claimed", func(t *testing.T) {
		t.Parallel()
		p := newPayments(t)
		c, err := idemtest.NewConsumer(p.pool, &consumer.Config{Store: p.store,
			Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				return p.charge(ctx, tx, m.ID)
			})})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Deliver(t.Context(), payment("pay-1", 1)); err != nil {
			t.Fatal(err)
		}
		f := report(t, func(tb testing.TB) {
			idemtest.RequireRecovers(t.Context(), tb, c, idemtest.CrashInHandler, payment("pay-1", 1), p.total)
		})
		requireReported(t, f, "never reached the crash in the handler")
		if !f.fatal {
			t.Fatalf("the kit went on after the crash could not be made")
		}
	})
}
