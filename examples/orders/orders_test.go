package main

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// TestScenario runs the demo in a schema and a topic of its own, then checks
// in the database that each payment was applied once, and that the producer
// retry and the replay were acknowledged as duplicates, not applied.
func TestScenario(t *testing.T) {
	db := testenv.NewDB(t) // names the schema and drops it at cleanup; the scenario recreates it
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	res, err := scenario(ctx, testenv.DatabaseURL(t), testenv.Brokers(t), db.Schema, t.Output(), nil)
	if err != nil {
		t.Fatalf("scenario: %v", err)
	}

	// Read on the test's own pool (search_path ''), not through the scenario.
	var id string
	var balance int64
	balances := map[string]int64{}
	rows, _ := db.Pool.Query(ctx, `SELECT id, balance FROM `+db.Table("accounts"))
	if _, err := pgx.ForEachRow(rows, []any{&id, &balance}, func() error {
		balances[id] = balance
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"ana": 30700, "bruno": 18580, "carla": 28240}
	if !maps.Equal(balances, want) {
		t.Fatalf("balances %v, want %v (each order paid once)", balances, want)
	}
	var paid, claimed int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("orders")+` WHERE status = 'paid'`).Scan(&paid); err != nil {
		t.Fatal(err)
	}
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+db.Table("processed_messages")+` WHERE consumer = $1`,
		consumerName).Scan(&claimed); err != nil {
		t.Fatal(err)
	}
	if paid != len(orders) || claimed != len(orders) {
		t.Fatalf("%d orders paid and %d IDs claimed, want %d of each", paid, claimed, len(orders))
	}

	// Every event is applied on its first delivery; its other deliveries (the
	// producer retry, the replay) are acknowledged as duplicates.
	if res.Retried != "pay-order-842" || res.Replayed == "" {
		t.Fatalf("retried %q, replayed %q: want pay-order-842 and an event consumer 1 applied", res.Retried, res.Replayed)
	}
	deliveries := map[string]int{}
	for _, o := range orders {
		deliveries["pay-"+o.id]++
	}
	deliveries[res.Retried]++
	deliveries[res.Replayed]++
	if len(res.Outcomes) != len(deliveries) {
		t.Fatalf("outcomes for %d IDs, want %d: %v", len(res.Outcomes), len(deliveries), res.Outcomes)
	}
	for id, n := range deliveries {
		want := []consumer.Outcome{consumer.Applied}
		for range n - 1 {
			want = append(want, consumer.Duplicate)
		}
		if got := res.Outcomes[id]; !slices.Equal(got, want) {
			t.Errorf("%s: outcomes %v, want %v", id, got, want)
		}
	}
}
