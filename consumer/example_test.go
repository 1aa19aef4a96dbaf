package consumer_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/idemtest"
	"github.com/idemkit/idemkit/kafkaconn"
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
	dead, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: kafkaconn.Config{Brokers: brokers}, Group: "order-service"})
	if err != nil {
		log.Fatal(err)
	}
	defer dead.Close()

	r, err := consumer.New(pool, &consumer.Config{
		Kafka: kafkaconn.Config{Brokers: brokers}, Topic: "payments", GroupID: "order-service",
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

// A producer retry sends payment pay-1 twice: the handler runs once for it,
// and the second copy is acknowledged as a duplicate.
func ExampleRunner_Run() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEMKIT_TEST_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	s, err := idemtest.CreateSchema(ctx, pool) // a fresh schema with idemkit's tables
	if err != nil {
		log.Fatal(err)
	}
	defer s.Drop(ctx)
	brokers := strings.Split(os.Getenv("IDEMKIT_TEST_KAFKA_BROKERS"), ",")
	topic, dropTopic, err := idemtest.CreateTopic(ctx, brokers, 1)
	if err != nil {
		log.Fatal(err)
	}
	defer dropTopic(ctx)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		log.Fatal(err)
	}
	payments := s.Table("payments")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+payments+` (id text PRIMARY KEY, charges int NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll}
	var msgs []kafka.Message
	for _, id := range []string{"pay-1", "pay-2", "pay-1"} { // the third is a producer retry
		msgs = append(msgs, kafka.Message{Value: []byte(id), Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		log.Fatal(err)
	}
	_ = w.Close()

	runCtx, stop := context.WithCancel(ctx)
	seen := 0
	r, err := consumer.New(pool, &consumer.Config{
		Kafka: kafkaconn.Config{Brokers: brokers}, Topic: topic, GroupID: topic + "-payments", Store: store,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+payments+` (id, charges) VALUES ($1, 1)
				ON CONFLICT (id) DO UPDATE SET charges = `+payments+`.charges + 1`, msg.ID)
			return err
		}),
		Observers: []consumer.Observer{outcomePrinter(func(msg *consumer.Message, o consumer.Outcome) {
			fmt.Println(o, msg.ID)
			if seen++; seen == len(msgs) {
				stop()
			}
		})},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Run(runCtx); err != nil {
		log.Fatal(err)
	}
	var charges int
	if err := pool.QueryRow(ctx, `SELECT charges FROM `+payments+` WHERE id = 'pay-1'`).Scan(&charges); err != nil {
		log.Fatal(err)
	}
	fmt.Println("pay-1 charged", charges, "time")
	// Output:
	// applied pay-1
	// applied pay-2
	// duplicate pay-1
	// pay-1 charged 1 time
}

// outcomePrinter is an OutcomeObserver made of a function.
type outcomePrinter func(msg *consumer.Message, o consumer.Outcome)

func (f outcomePrinter) Outcome(_ context.Context, e *consumer.OutcomeEvent) { f(e.Message, e.Outcome) }
