package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/retry"
)

// TestCountsByOutcome runs a consumer over known messages — five new, two
// redelivered, one that fails once and is retried, one that fails for good
// and is dead-lettered — and checks that the counters say exactly that, in
// per-message and in batched mode; then a reprocessor replays the dead
// letter and the replay counter says so.
func TestCountsByOutcome(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 0} {
		name := map[int]string{1: "per-message", 0: "batched"}[batch]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			dlqTopic := e.topic + dlq.TopicSuffixDefault
			testenv.CreateTopic(t, dlqTopic, 1)
			e.produce(msg("a", "k1"), msg("b", "k2"), msg("flaky", "k3"), msg("c", "k4"), msg("bad", "k5"),
				msg("a", "k1"), msg("d", "k6"), msg("b", "k2"), msg("e", "k7"))

			var mu sync.Mutex
			failedOnce := false
			cfg := e.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				switch m.ID {
				case "bad":
					return retry.Permanent(errors.New("rejected"))
				case "flaky":
					mu.Lock()
					first := !failedOnce
					failedOnce = true
					mu.Unlock()
					if first {
						return errors.New("try again")
					}
				}
				return e.effect(ctx, tx, m)
			})
			cfg.BatchSize = batch
			oc := newOutcomes(9)
			testobs.Of(cfg).OnOutcome = oc.hook
			w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()

			c, err := e.tel.Consumer(cfg)
			if err != nil {
				t.Fatal(err)
			}
			cfg.OnFailure = c.DeadLetters(w)
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, r)
			wait(t, oc.done, "9 outcomes")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			// The user's own hook was chained, not replaced.
			if got := oc.count(consumer.Applied); got != 6 {
				t.Errorf("the config's own Outcome hook saw %d applied, want 6", got)
			}

			rm := e.collect()
			base := lbl("consumer", e.group, "topic", e.topic)
			with := func(k, v string) string { return lbl("consumer", e.group, "topic", e.topic, k, v) }
			want := map[string]float64{
				with("outcome", "applied"):   6,
				with("outcome", "duplicate"): 2,
				with("outcome", "failed"):    1,
				with("outcome", "parked"):    0,
			}
			if got := points(t, rm, "idemkit.consumer.messages"); !maps.Equal(got, want) {
				t.Errorf("messages = %v, want %v", got, want)
			}
			want = map[string]float64{
				with("class", "transient"): 1,
				with("class", "permanent"): 0,
				with("class", "unknown"):   0,
			}
			if got := points(t, rm, "idemkit.consumer.retries"); !maps.Equal(got, want) {
				t.Errorf("retries = %v, want %v", got, want)
			}
			want = map[string]float64{with("dlq_topic", dlqTopic): 1}
			if got := points(t, rm, "idemkit.dlq.writes"); !maps.Equal(got, want) {
				t.Errorf("dlq writes = %v, want %v", got, want)
			}
			want = map[string]float64{"consumer=" + e.group: 1}
			if got := points(t, rm, "idemkit.consumer.rebalances"); !maps.Equal(got, want) {
				t.Errorf("rebalances = %v, want %v", got, want)
			}
			want = map[string]float64{"consumer=" + e.group: 0}
			if got := points(t, rm, "idemkit.consumer.offset_commit_failures"); !maps.Equal(got, want) {
				t.Errorf("offset commit failures = %v, want %v", got, want)
			}
			if got := points(t, rm, "idemkit.consumer.outage_active"); !maps.Equal(got, want) {
				t.Errorf("active outages = %v, want %v", got, want)
			}
			// Every handler call is timed: 6 applied, 2 failed attempts
			// (flaky once, bad once) and, in batched mode, the calls of
			// batches rolled back around a failure.
			calls := points(t, rm, "idemkit.consumer.handler.duration")[base]
			if calls < 8 || (batch == 1 && calls != 8) {
				t.Errorf("handler calls timed = %v, want 8 (per message) or more (batched)", calls)
			}
			tx := points(t, rm, "idemkit.consumer.transaction.duration")
			if tx[with("result", "commit")] < 1 || tx[with("result", "rollback")] < 2 {
				t.Errorf("transactions = %v, want commits and at least 2 rollbacks", tx)
			}
			if batch == 1 && tx[with("result", "commit")] != 8 {
				// 6 applied and 2 duplicates, one transaction each.
				t.Errorf("committed transactions = %v, want 8", tx[with("result", "commit")])
			}
			sizes := points(t, rm, "idemkit.consumer.batch.messages")[base]
			if sizes != tx[with("result", "commit")]+tx[with("result", "rollback")] {
				t.Errorf("batch sizes recorded %v times, want once per transaction (%v)", sizes, tx)
			}

			// Replaying the dead letter counts it by what was done.
			rcfg := &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: dlqTopic, Mode: dlq.Redrive,
				Handler: consumer.HandlerFunc(e.effect), Tables: e.store.Tables()}
			if err := e.tel.Reprocessor(rcfg); err != nil {
				t.Fatal(err)
			}
			rp, err := dlq.NewReprocessor(e.db.Pool, rcfg)
			if err != nil {
				t.Fatal(err)
			}
			defer rp.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := rp.Run(ctx); err != nil {
				t.Fatal(err)
			}
			want = map[string]float64{"dlq_topic=" + dlqTopic + ",outcome=applied": 1}
			if got := points(t, e.collect(), "idemkit.dlq.replayed"); !maps.Equal(got, want) {
				t.Errorf("replayed = %v, want %v", got, want)
			}
		})
	}
}

// TestChainsExistingMiddleware: the middleware the config already had stays,
// outermost; the telemetry's is appended.
func TestChainsExistingMiddleware(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	e.produce(msg("a", "k"))
	var order []string
	var mu sync.Mutex
	cfg := e.config(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		mu.Lock()
		order = append(order, "handler")
		mu.Unlock()
		return e.effect(ctx, tx, m)
	})
	cfg.Middleware = []consumer.Middleware{func(next consumer.Handler) consumer.Handler {
		return consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			mu.Lock()
			order = append(order, "user middleware")
			mu.Unlock()
			return next.Handle(ctx, tx, m)
		})
	}}
	var started, ended int
	testobs.Of(cfg).OnTxStart = func(ctx context.Context, msgs []*consumer.Message, attempt int) context.Context {
		mu.Lock()
		defer mu.Unlock()
		started++
		return nil
	}
	testobs.Of(cfg).OnTxEnd = func(context.Context, []*consumer.Message, []consumer.Outcome, error, time.Duration) {
		mu.Lock()
		defer mu.Unlock()
		ended++
	}
	oc := newOutcomes(1)
	testobs.Of(cfg).OnOutcome = oc.hook
	if _, err := e.tel.Consumer(cfg); err != nil {
		t.Fatal(err)
	}
	if len(cfg.Middleware) != 2 {
		t.Fatalf("Middleware has %d entries, want the user's and the telemetry's", len(cfg.Middleware))
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, r)
	wait(t, oc.done, "1 outcome")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(order) != "[user middleware handler]" || started != 1 || ended != 1 {
		t.Errorf("order %v, TxStart %d, TxEnd %d: want the user's middleware and hooks to run once", order, started, ended)
	}
	base := lbl("consumer", e.group, "topic", e.topic)
	if got := points(t, e.collect(), "idemkit.consumer.handler.duration")[base]; got != 1 {
		t.Errorf("handler calls timed = %v, want 1", got)
	}
	if n := len(e.spans.Ended()); n != 1 {
		t.Errorf("%d spans, want 1", n)
	}
}
