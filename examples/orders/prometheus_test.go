package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/promtest"
	"github.com/idemkit/idemkit/internal/testenv"
)

// TestPrometheusScrapesTheDemo runs the demo with its telemetry while a real
// Prometheus server (Debian's package, installed by scripts/dev prometheus)
// scrapes its /metrics, then asks Prometheus's HTTP API for the counters:
// they must equal what the demo saw happen (10 applied, 2 duplicates).
func TestPrometheusScrapesTheDemo(t *testing.T) {
	obs, err := startTelemetry("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.shutdown(context.Background()) })
	prom := promtest.Start(t, []string{obs.addr})

	db := testenv.NewDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := scenario(ctx, testenv.DatabaseURL(t), testenv.Brokers(t), db.Schema, t.Output(), obs)
	if err != nil {
		t.Fatalf("scenario: %v", err)
	}
	want := map[consumer.Outcome]int{}
	for _, outs := range res.Outcomes {
		for _, o := range outs {
			want[o]++
		}
	}
	if want[consumer.Applied] != len(orders) || want[consumer.Duplicate] != 2 {
		t.Fatalf("the demo saw %v, want %d applied and 2 duplicates", want, len(orders))
	}
	for _, o := range []consumer.Outcome{consumer.Applied, consumer.Duplicate} {
		q := fmt.Sprintf(`sum(idemkit_consumer_messages_total{topic=%q,outcome=%q})`, res.Topic, o)
		prom.WaitForValue(t, q, float64(want[o]))
	}
	// Both consumers (two groups, one Name) joined a group once each.
	prom.WaitForValue(t, `sum(idemkit_consumer_rebalances_total{consumer="order-service"}) >= bool 2`, 1)
}
