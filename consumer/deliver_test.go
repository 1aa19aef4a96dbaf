package consumer_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
)

// TestDeliver: Runner.Deliver runs the runner's transaction without a
// broker: a new ID is applied and its position recorded, a redelivery and a
// copy in the same batch are duplicates, a failing handler rolls back its
// effect with the claim, a message without an ID is refused, and the hooks
// of the transaction run. Per-message and batch handlers alike.
func TestDeliver(t *testing.T) {
	t.Parallel()
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "handler", true: "batch-handler"}[batch], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			ctx := context.Background()
			fail := false
			var rolledBack, after int
			var seen []consumer.Outcome
			cfg := &consumer.Config{Kafka: kafkaconn.Config{Brokers: []string{"unused.invalid:9092"}}, Topic: e.topic, GroupID: e.group,
				Store: e.store}
			testobs.Of(cfg).OnTxEnd = func(_ context.Context, _ []*consumer.Message, _ []consumer.Outcome, err error, _ time.Duration) {
				if err == nil {
					after++
				} else {
					rolledBack++
				}
			}
			testobs.Of(cfg).OnOutcome = func(_ context.Context, _ *consumer.Message, o consumer.Outcome) { seen = append(seen, o) }
			errBoom := errors.New("boom")
			if batch {
				cfg.BatchHandler = consumer.BatchHandlerFunc(func(ctx context.Context, tx pgx.Tx, msgs []*consumer.Message) error {
					if err := e.batchEffect(ctx, tx, msgs); err != nil || !fail {
						return err
					}
					return errBoom
				})
			} else {
				cfg.Handler = consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
					if err := e.effect(ctx, tx, m); err != nil || !fail {
						return err
					}
					return errBoom
				})
			}
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			deliver := func(want []consumer.Outcome, msgs ...kafka.Message) {
				t.Helper()
				got, err := r.Deliver(ctx, msgs...)
				if err != nil || !slices.Equal(got, want) {
					t.Fatalf("Deliver = %v, %v; want %v", got, err, want)
				}
			}
			a := msg("a", "k", 5)
			a.Offset = 7
			deliver([]consumer.Outcome{consumer.Applied}, a)
			deliver([]consumer.Outcome{consumer.Duplicate}, a)
			b, b2 := msg("b", "k", 1), msg("b", "k", 1)
			b.Offset, b2.Offset = 8, 9 // a producer retry in the same fetch
			deliver([]consumer.Outcome{consumer.Applied, consumer.Duplicate}, b, b2)
			if got := e.runs(); got["a"] != 1 || got["b"] != 1 {
				t.Fatalf("runs %v, want a and b once", got)
			}
			pos, err := e.store.Positions(ctx, e.db.Pool, e.group, e.topic)
			if err != nil || pos[0] != 10 {
				t.Fatalf("positions %v, %v; want partition 0 at 10", pos, err)
			}
			if rolledBack != 0 || after != 3 || len(seen) != 4 {
				t.Fatalf("TxEnd %d committed, %d rolled back, outcomes %v; want 3, 0 and 4 outcomes", after, rolledBack, seen)
			}

			fail = true
			c := msg("c", "k", 1)
			c.Offset = 10
			if _, err := r.Deliver(ctx, c); !errors.Is(err, errBoom) {
				t.Fatalf("Deliver with a failing handler: %v, want boom", err)
			}
			if got := e.runs(); got["c"] != 0 || rolledBack != 1 {
				t.Fatalf("the failed transaction left its effect (%v) or its TxEnd said %d rollbacks", got, rolledBack)
			}
			fail = false
			deliver([]consumer.Outcome{consumer.Applied}, c) // the claim went with the rollback

			if _, err := r.Deliver(ctx, msg("", "k", 1)); !errors.Is(err, consumer.ErrMissingID) {
				t.Fatalf("Deliver without an ID: %v, want ErrMissingID", err)
			}
			other := msg("d", "k", 1)
			other.Topic = "another"
			if _, err := r.Deliver(ctx, other); !errors.Is(err, consumer.ErrDeliverInput) {
				t.Fatalf("Deliver of another topic: %v, want ErrDeliverInput", err)
			}
		})
	}
}
