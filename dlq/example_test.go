package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/kafkaconn"
)

// Replay the dead letters of payments.dlq whose last error mentions the tax
// service, through the fixed handler, in the consumer's own dedup scope.
func ExampleReprocessor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	r, err := dlq.NewReprocessor(pool, &dlq.ReprocessorConfig{
		Kafka: kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}},
		Topic: "payments.dlq",
		Mode:  dlq.Redrive,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			_, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, string(msg.Key))
			return err
		}),
		Filter: dlq.Filter{ErrorContains: "tax service"},
		Rate:   50, // dead letters per second
		Progress: func(it dlq.Item) {
			if it.DeadLetter != nil {
				fmt.Println(it.Action, it.DeadLetter.MessageID)
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer r.Close()
	sum, err := r.Run(ctx) // to the end of the topic as it is now
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(sum.Records[dlq.Applied], "applied,", sum.Records[dlq.AlreadyApplied], "already applied")
}

// Send validation failures to orders.invalid and the rest to orders.dlq,
// then list both with each dead letter's state, a message's rounds together.
func ExampleRouteErrors() {
	ctx := context.Background()
	kc := kafkaconn.Config{Brokers: []string{"127.0.0.1:9092"}}
	errInvalid := errors.New("invalid order") // what the handler wraps
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: kc, Group: "billing",
		Routes: []dlq.Route{dlq.RouteErrors("orders.invalid", errInvalid)}})
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()
	// consumer.Config{..., OnFailure: w.OnFailure}

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	l, err := dlq.List(ctx, pool, &dlq.ListConfig{Kafka: kc, Topics: w.Topics("orders")})
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range l.Messages {
		fmt.Println(m.MessageID, m.State, len(m.Letters), "dead letter(s)")
	}
	fmt.Println(l.States[dlq.StateUnresolved], "message(s) wait for a replay")
}
