package idemotel_test

import (
	"context"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testobs"
)

// TestBeyondHorizonCounted: messages beyond the dedup horizon are counted
// by what became of them, and the config's own hook still runs.
func TestBeyondHorizonCounted(t *testing.T) {
	t.Parallel()
	for _, policy := range []consumer.HorizonPolicy{consumer.HorizonFail, consumer.HorizonApply} {
		name := map[consumer.HorizonPolicy]string{consumer.HorizonFail: "fail", consumer.HorizonApply: "apply"}[policy]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, 1)
			old := time.Now().Add(-3 * time.Hour)
			m1, m2 := msg("old-1", "k1"), msg("old-2", "k2")
			m1.Time, m2.Time = old, old
			e.produce(msg("a", "k0"), m1, m2, msg("b", "k3"))
			cfg := e.config(nil)
			cfg.Retention, cfg.OnBeyondHorizon = time.Hour, policy
			cfg.OnFailure = func(context.Context, *consumer.Message, error) error { return nil }
			oc := newOutcomes(4)
			testobs.Of(cfg).OnOutcome = oc.hook
			var mu sync.Mutex
			own := 0
			testobs.Of(cfg).OnBeyondHorizon = func(context.Context, *consumer.Message, *consumer.HorizonError, bool) {
				mu.Lock()
				own++
				mu.Unlock()
			}
			if _, err := e.tel.Consumer(cfg); err != nil { // adds its observer to cfg
				t.Fatal(err)
			}
			r, err := consumer.New(e.db.Pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, r)
			wait(t, oc.done, "4 outcomes")
			if err := stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			mu.Lock()
			if own != 2 {
				t.Errorf("the config's own BeyondHorizon hook ran %d times, want 2", own)
			}
			mu.Unlock()
			with := func(v string) string { return lbl("consumer", e.group, "topic", e.topic, "action", v) }
			want := map[string]float64{with("failed"): 2, with("applied"): 0}
			if policy == consumer.HorizonApply {
				want = map[string]float64{with("failed"): 0, with("applied"): 2}
			}
			if got := points(t, e.collect(), "idemkit.consumer.beyond_horizon"); !maps.Equal(got, want) {
				t.Errorf("beyond horizon = %v, want %v", got, want)
			}
		})
	}
}
