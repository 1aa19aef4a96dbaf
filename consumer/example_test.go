package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// An order service that marks orders paid once per OrderPaid event. The
// handler's writes, the message's dedup claim and the partition's position
// commit in one transaction; the Kafka offset follows.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	m, err := migrate.New(pool, nil) // idemkit's tables, in schema public
	if err != nil {
		log.Fatal(err)
	}
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}

	brokers := []string{"127.0.0.1:9092"}
	dead, err := dlq.NewWriter(&dlq.WriterConfig{Brokers: brokers, Group: "order-service"})
	if err != nil {
		log.Fatal(err)
	}
	defer dead.Close()

	r, err := consumer.New(&consumer.Config{
		Brokers: brokers, Topic: "payments", GroupID: "order-service", Pool: pool,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			var ev struct {
				OrderID string `json:"orderId"`
				Amount  int64  `json:"amount"`
			}
			if err := json.Unmarshal(msg.Value, &ev); err != nil {
				return retry.Permanent(fmt.Errorf("decode OrderPaid: %w", err)) // never retried: dead-lettered
			}
			if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, ev.OrderID); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $2
				WHERE id = (SELECT account_id FROM orders WHERE id = $1)`, ev.OrderID, ev.Amount)
			return err
		}),
		FailureMode: consumer.NonBlocking, // a failing order parks its key only
		OnFailure:   dead.OnFailure,       // what fails for good goes to payments.dlq
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(ctx); err != nil { // returns after every goroutine exited
		log.Fatal(err)
	}
}
