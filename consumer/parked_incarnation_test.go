package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestParkedAcrossRecreation: a message parked from the old topic shares
// its (consumer, topic, partition, offset) with a message of the new
// incarnation parked behind the same key; both stay parked (a parked row
// keyed without the incarnation would let ON CONFLICT DO NOTHING drop the
// new one while the position moves past it).
func TestParkedAcrossRecreation(t *testing.T) {
	t.Parallel()
	for _, md := range baseModes {
		t.Run(md.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			e.produce(msg("a0", "A", 1), msg("b1", "B", 1))
			fail := func(_ context.Context, m *consumer.Message) error {
				if m.ID == "a0" {
					return errors.New("A's dependency is down")
				}
				return nil
			}
			cfg := e.config(md, fail)
			cfg.FailureMode = consumer.NonBlocking
			cfg.OnRecreated = consumer.RecreatedRestart
			cfg.Retry = retry.Policy{MaxAttempts: 1}
			cfg.ParkedRetry = retry.Policy{InitialInterval: time.Hour, MaxInterval: time.Hour, MaxAttempts: 100}
			oc := newOutcomes(-1)
			done := make(chan struct{})
			var once sync.Once
			testobs.Of(cfg).OnOutcome = func(ctx context.Context, m *consumer.Message, o consumer.Outcome) {
				oc.hook(ctx, m, o)
				if m.ID == "b1" {
					once.Do(func() { close(done) })
				}
			}
			stop := run(t, e.db.Pool, cfg)
			wait(t, done, "b1")
			if err := stop(); err != nil {
				t.Fatal(err)
			}

			e.recreateTopic(1)
			e.produce(msg("n0", "A", 1), msg("n1", "C", 1))
			cfg2 := e.config(md, fail)
			cfg2.FailureMode = consumer.NonBlocking
			cfg2.OnRecreated = consumer.RecreatedRestart
			cfg2.Retry = cfg.Retry
			cfg2.ParkedRetry = cfg.ParkedRetry
			done2 := make(chan struct{})
			var once2 sync.Once
			outs := map[string]consumer.Outcome{}
			var mu sync.Mutex
			testobs.Of(cfg2).OnOutcome = func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
				mu.Lock()
				outs[m.ID] = o
				mu.Unlock()
				if m.ID == "n1" {
					once2.Do(func() { close(done2) })
				}
			}
			stop = run(t, e.db.Pool, cfg2)
			wait(t, done2, "n1")
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			t.Logf("outcomes of the new incarnation: %v", outs)
			var ids []string
			rows, err := e.db.Pool.Query(context.Background(), `SELECT message_id FROM `+e.db.Table(migrate.ParkedMessagesDefault))
			if err != nil {
				t.Fatal(err)
			}
			for rows.Next() {
				var id string
				if err := rows.Scan(&id); err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			pos, _ := e.store.ListPositions(context.Background(), e.db.Pool, e.group, e.topic)
			t.Logf("parked rows: %v; position %+v; effects %v", ids, pos, e.runs())
			slices.Sort(ids)
			if !slices.Equal(ids, []string{"a0", "n0"}) || outs["n0"] != consumer.Parked || e.runs()["n1"] != 1 {
				t.Fatalf("parked %v, n0 %v, effects %v: want a0 and n0 parked (n0 behind its key A), n1 applied", ids, outs["n0"], e.runs())
			}
		})
	}
}
