package fault

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestInstancesJoinAndLeave runs 20,000 messages over 6 partitions through
// two, then three consumer instances of one group, with instances joining and
// leaving mid-stream: every message's effect happens exactly once, none is
// lost, and within each partition effects are applied in offset order.
func TestInstancesJoinAndLeave(t *testing.T) {
	t.Parallel()
	for _, md := range []struct {
		name  string
		batch int
		set   bool
	}{
		{name: "per-message", batch: 1},
		{name: "default"}, // adaptive batches
		{name: "batched", batch: 100},
		{name: "batch-handler", batch: 100, set: true},
	} {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			const total, partitions = 20000, 6
			db := newDB(t)
			topic := testenv.NewTopic(t, partitions)
			group := testenv.Name(t, "g")
			store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
			if err != nil {
				t.Fatal(err)
			}
			table := db.Table("effects")

			// progress waits until the effects table holds at least n rows.
			var applied int64
			progress := func(n int64) {
				deadline := time.Now().Add(3 * time.Minute)
				for time.Now().Before(deadline) {
					if err := db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM `+table).Scan(&applied); err != nil {
						t.Fatal(err)
					}
					if applied >= n {
						return
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			cfg := consumer.Config{
				Kafka: testenv.Kafka(t), Topic: topic, GroupID: group, Store: store,
				BatchSize: md.batch, SessionTimeout: 6 * time.Second,
			}
			if md.set {
				cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
					return batchEffect(ctx, tx, table, msgs)
				})
			} else {
				cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					return applyEffect(ctx, tx, table, m)
				})
			}

			var wg sync.WaitGroup
			start := func() (stop func()) {
				c := cfg
				r, err := consumer.New(db.Pool, &c)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(context.Background())
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := r.Run(ctx); err != nil {
						t.Errorf("instance stopped with %v", err)
					}
				}()
				return cancel
			}

			stopA := start()
			stopB := start()
			t.Cleanup(func() { stopA(); stopB(); wg.Wait() })

			produce(t, topic, "m-", 0, total/2, 200)
			progress(total / 5)
			stopC := start() // a third instance joins
			t.Cleanup(stopC)
			produce(t, topic, "m-", total/2, total/2, 200)
			progress(total / 2)
			stopA() // one leaves
			progress(3 * total / 4)
			stopD := start() // another joins
			t.Cleanup(stopD)
			progress(total)
			if applied != total {
				t.Fatalf("%d effects after 3 minutes, want %d", applied, total)
			}

			runs := effectRuns(t, db)
			if len(runs) != total {
				t.Fatalf("%d messages had an effect, want %d", len(runs), total)
			}
			for i := range total {
				if id := "m-" + strconv.Itoa(i); runs[id] != 1 {
					t.Fatalf("%s ran %d times", id, runs[id])
				}
			}
			checkOrder(t, db)
			t.Log(fmt.Sprintf("%d effects exactly once across joins and leaves", total))
		})
	}
}
