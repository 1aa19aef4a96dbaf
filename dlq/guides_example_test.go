package dlq_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/kafkaconn"
)

// Republish the dead letters of one message ID to their origin topic: a dry
// run first, then the replay; the consumer's dedup absorbs any repeat.
func ExampleReprocessor_republish() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	for _, dryRun := range []bool{true, false} {
		r, err := dlq.NewReprocessor(pool, &dlq.ReprocessorConfig{
			Kafka:  kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}},
			Topic:  "payments.dlq",
			Mode:   dlq.Republish,
			Filter: dlq.Filter{MessageIDs: []string{"pay-7"}},
			DryRun: dryRun,
		})
		if err != nil {
			log.Fatal(err)
		}
		sum, err := r.Run(ctx)
		r.Close()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("dry run:", dryRun, sum.Messages)
	}
}
