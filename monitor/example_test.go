package monitor_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/monitor"
)

// A health check reads one Snapshot: each consumer's lag and parked
// messages, and the outbox backlog, whichever process runs them.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	m, err := monitor.New(&monitor.Config{Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	s, err := m.Collect(ctx, pool)
	if err != nil {
		log.Print(err) // the parts that could be read are in s
	}
	for _, c := range s.Consumers {
		fmt.Printf("%s on %s: lag %d, parked %d\n", c.Name, c.Topic, c.Lag, c.Parked)
	}
	if s.Outbox != nil {
		fmt.Printf("outbox %s: %d waiting, %d dead\n", s.Outbox.Table, s.Outbox.Backlog, s.Outbox.Dead)
	}
	for _, t := range s.Missing {
		fmt.Println("not migrated:", t)
	}
}
