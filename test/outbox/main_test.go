// Package outbox holds the outbox tests that need more than one package or
// process: the consumer → outbox → relay → consumer chain with a relay killed
// between publish and mark, and a relay whose Kafka broker goes away.
package outbox

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/test/internal/containers"
)

func TestMain(m *testing.M) {
	// The crash test runs this same binary as the relay process it kills.
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	testenv.Main(m, containers.Start)
}

func newDB(t *testing.T) (*testenv.DB, *outbox.Store) {
	t.Helper()
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		if err := testenv.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "effects"}.Sanitize()+
			` (id text PRIMARY KEY, runs int NOT NULL)`)
		return err
	})
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	return db, store
}

// readAll returns every message of topic, partition after partition, each
// in offset order.
func readAll(t *testing.T, brokers []string, topic string) []kafka.Message {
	t.Helper()
	return testenv.ReadAll(t, brokers, topic)
}

func header(m kafka.Message, key string) string {
	for _, h := range m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// waitFor polls cond every 50ms until it holds, or fails after d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := cond()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func backlog(db *testenv.DB, store *outbox.Store) func() (int64, error) {
	return func() (int64, error) {
		st, err := store.Stats(context.Background(), db.Pool)
		if err != nil {
			return 0, err
		}
		if st.Dead != 0 {
			return 0, fmt.Errorf("%d dead messages", st.Dead)
		}
		return st.Backlog, nil
	}
}
