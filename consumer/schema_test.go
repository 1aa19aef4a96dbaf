package consumer_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestSchemaMigratedDownFailsAtStart: a runner on a schema whose
// migrations were reverted refuses to start, before any message, with an
// error that says to run the migrations (not a raw SQLSTATE at the first
// statement that needs a missing table).
func TestSchemaMigratedDownFailsAtStart(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			m, err := migrate.New(e.db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: e.db.Schema}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Down(context.Background(), 0); err != nil {
				t.Fatal(err)
			}
			e.produce(msg("m1", "A", 1), msg("m2", "B", 1), msg("bad", "C", 1))
			cfg := e.config(md, func(_ context.Context, m *consumer.Message) error {
				if m.ID == "bad" {
					return errors.New("transient")
				}
				return nil
			})
			cfg.FailureMode = consumer.NonBlocking
			cfg.Retry = retry.Policy{MaxAttempts: 1}
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = r.Run(ctx)
			t.Logf("Run: %v; effects before it returned: %v", err, e.runs())
			if !errors.Is(err, consumer.ErrNotMigrated) || !strings.Contains(err.Error(), "migrat") || len(e.runs()) > 0 {
				t.Fatalf("want Run to refuse at start, before any message, with an error that says to migrate")
			}
		})
	}
}

// TestUnmigratedSchemaError: a runner on a schema without idemkit's
// tables returns an error that says to run the migrations (as outbox and
// idemhttp do with ErrNotMigrated), not a raw SQLSTATE 42P01.
func TestUnmigratedSchemaError(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.NewDB(t, func(context.Context, *pgxpool.Pool, string) error { return nil })
			store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
			if err != nil {
				t.Fatal(err)
			}
			topic := testenv.NewTopic(t, 1)
			r, err := consumer.New(db.Pool, &consumer.Config{Kafka: testenv.Kafka(t), Topic: topic, GroupID: testenv.Name(t, "g"),
				Store: store, BatchSize: md.batch,
				Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = r.Run(ctx)
			t.Logf("Run: %v", err)
			if !errors.Is(err, consumer.ErrNotMigrated) || !strings.Contains(strings.ReplaceAll(err.Error(), db.Schema, ""), "migrat") {
				t.Fatalf("want an error that says to run the migrations")
			}
		})
	}
}
