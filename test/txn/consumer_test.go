package txn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/txproducer"
)

// consumerDB is a migrated schema with an effects table that records, per
// message ID, how often it was applied and where it was read.
type consumerDB struct {
	db      *testenv.DB
	store   *dedup.Store
	effects string
}

func newConsumerDB(t *testing.T) *consumerDB {
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		if err := testenv.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "effects"}.Sanitize()+` (
			id text PRIMARY KEY, runs int NOT NULL, kafka_partition int NOT NULL, kafka_offset bigint NOT NULL)`)
		return err
	})
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	return &consumerDB{db: db, store: store, effects: db.Table("effects")}
}

func (c *consumerDB) apply(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+c.effects+` (id, runs, kafka_partition, kafka_offset) VALUES ($1, 1, $2, $3)
		ON CONFLICT (id) DO UPDATE SET runs = `+c.effects+`.runs + 1`, m.ID, m.Partition, m.Offset)
	return err
}

// applied returns what was applied, as records, and fails on a record
// applied twice.
func (c *consumerDB) applied(t *testing.T) []rec {
	t.Helper()
	rows, err := c.db.Pool.Query(context.Background(), `SELECT id, runs, kafka_partition, kafka_offset FROM `+c.effects)
	if err != nil {
		t.Fatal(err)
	}
	var out want
	var (
		r    rec
		runs int
	)
	if _, err := pgx.ForEachRow(rows, []any{&r.ID, &runs, &r.Partition, &r.Offset}, func() error {
		if runs != 1 {
			return fmt.Errorf("%s applied %d times", r.ID, runs)
		}
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out.sorted()
}

// consumerMode is one way of running the consumer.
type consumerMode struct {
	name        string
	batch       int
	set         bool
	nonBlocking bool
}

var consumerModes = []consumerMode{
	{name: "per-message", batch: 1},
	{name: "default"}, // adaptive batches
	{name: "batched", batch: 50},
	{name: "batch-handler", batch: 50, set: true},
	{name: "non-blocking", nonBlocking: true},
}

func (c *consumerDB) config(t *testing.T, md consumerMode, topic string) *consumer.Config {
	cfg := &consumer.Config{
		Kafka: testenv.Kafka(t), Topic: topic, GroupID: testenv.Name(t, "g"), Store: c.store,
		BatchSize: md.batch, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)),
		Retry: retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
	}
	if md.nonBlocking {
		cfg.FailureMode = consumer.NonBlocking
	}
	if md.set {
		cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
			for _, m := range msgs {
				if err := c.apply(ctx, tx, m); err != nil {
					return err
				}
			}
			return nil
		})
	} else {
		cfg.Handler = consumer.HandlerFunc(c.apply)
	}
	return cfg
}

// runConsumer runs cfg until cond holds, failing the test if Run returns
// first (a marker handed over as a message has no ID: ErrMissingID).
func runConsumer(t *testing.T, pool *pgxpool.Pool, cfg *consumer.Config, what string, cond func() bool) {
	t.Helper()
	r, err := consumer.New(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()
	for deadline := time.Now().Add(2 * time.Minute); !cond(); {
		select {
		case err := <-errc:
			errc <- nil
			t.Fatalf("Run returned while waiting for %s: %v", what, err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestConsumerCommittedOnly: on a topic written by transactional producers
// (committed, aborted and interleaved transactions, non-transactional
// records between), each committed record is applied exactly once, no
// aborted record and no marker reaches a handler, and the positions and
// Kafka's committed offsets reach the log end, in every consumer mode.
func TestConsumerCommittedOnly(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 3)
	committed, _ := mixedTopic(t, topic, txproducer.None, 0)
	ends := map[int]int64{}
	for p := range 3 {
		ends[p] = stableBounds(t, topic, p).hw
	}
	for _, md := range consumerModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			c := newConsumerDB(t)
			cfg := c.config(t, md, topic)
			var committedOffsets sync.Map
			testobs.Of(cfg).OnOffsetCommitted = func(_ string, p int, next int64) { committedOffsets.Store(p, next) }
			runConsumer(t, c.db.Pool, cfg, "positions at the log end", func() bool {
				for p, end := range ends {
					if v, ok := committedOffsets.Load(p); !ok || v.(int64) != end {
						return false
					}
				}
				return true
			})
			equalRecs(t, "applied", c.applied(t), committed.sorted())
			positions, err := c.store.Positions(context.Background(), c.db.Pool, cfg.GroupID, topic)
			if err != nil {
				t.Fatal(err)
			}
			for p, end := range ends {
				if positions[p] != end {
					t.Fatalf("positions %v, want the log ends %v", positions, ends)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			res, err := testenv.Client(t).OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: cfg.GroupID,
				Topics: map[string][]int{topic: {0, 1, 2}}})
			if err != nil {
				t.Fatal(err)
			}
			for _, po := range res.Topics[topic] {
				if po.CommittedOffset != ends[po.Partition] {
					t.Fatalf("Kafka's committed offset of partition %d = %d, want the log end %d", po.Partition, po.CommittedOffset, ends[po.Partition])
				}
			}
		})
	}
}

// TestConsumerHeldByOpenTransaction: records after a transaction left open
// are not consumed until it ends; the hold is reported; then they come
// (commit) or the transaction's records are skipped (abort).
func TestConsumerHeldByOpenTransaction(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		for _, md := range consumerModes[:2] { // per-message and default
			t.Run(map[bool]string{true: "commit", false: "abort"}[commit]+"/"+md.name, func(t *testing.T) {
				t.Parallel()
				topic := testenv.NewTopic(t, 1)
				jp := txproducer.Start(t, bootstrap(t))
				open := jp.Producer("", txproducer.None)
				var before, held, opened want
				before.add(0, produce(t, topic, 0, 0, "n1"), "n1")
				open.Begin()
				sendAll(open, topic, 0, "h1", "h2")
				opened.add(0, open.Flush(), "h1", "h2")
				held.add(0, produce(t, topic, 0, 0, "n2"), "n2")

				c := newConsumerDB(t)
				cfg := c.config(t, md, topic)
				cfg.HeldWarnAfter = 500 * time.Millisecond
				var reported atomic.Int64
				testobs.Of(cfg).OnHeld = func(_ string, _ int, lastStable, _ int64, _ time.Duration) { reported.Store(lastStable + 1) }
				r, err := consumer.New(c.db.Pool, cfg)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				errc := make(chan error, 1)
				go func() { errc <- r.Run(ctx) }()
				defer func() {
					cancel()
					if err := <-errc; err != nil {
						t.Errorf("Run: %v", err)
					}
				}()
				waitUntil(t, "the hold reported", func() bool { return reported.Load() == opened[0].Offset+1 })
				equalRecs(t, "applied while the transaction is open", c.applied(t), before.sorted())

				expect := append(append(want{}, before...), held...)
				if commit {
					open.Commit()
					expect = append(expect, opened...)
				} else {
					open.Abort()
				}
				waitUntil(t, "the records after the transaction", func() bool { return len(c.applied(t)) == len(expect) })
				equalRecs(t, "applied after the transaction ended", c.applied(t), expect.sorted())
			})
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
