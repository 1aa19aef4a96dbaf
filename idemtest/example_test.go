package idemtest_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/idemtest"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// A handler run through the consumer's own transaction, without Kafka: the
// first delivery is applied, a redelivery and a producer retry are
// duplicates, and the charge is made once.
func ExampleConsumer_Deliver() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEMKIT_TEST_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	s, err := idemtest.CreateSchema(ctx, pool) // idemkit's tables in a fresh schema
	if err != nil {
		log.Fatal(err)
	}
	defer s.Drop(ctx)
	charges := s.Table("charges")
	if _, err := pool.Exec(ctx, `CREATE TABLE `+charges+` (id text PRIMARY KEY, n int NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		log.Fatal(err)
	}
	c, err := idemtest.NewConsumer(pool, &consumer.Config{Store: store, Name: "billing",
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+charges+` (id, n) VALUES ($1, 1)
				ON CONFLICT (id) DO UPDATE SET n = `+charges+`.n + 1`, msg.ID)
			return err
		})})
	if err != nil {
		log.Fatal(err)
	}
	msg := kafka.Message{Offset: 41, Value: []byte(`{"amount":100}`),
		Headers: []kafka.Header{{Key: "message-id", Value: []byte("pay-1")}}}
	retry := msg
	retry.Offset = 42 // the producer sent it again
	for _, m := range []kafka.Message{msg, msg, retry} {
		outcomes, err := c.Deliver(ctx, m)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("offset", m.Offset, outcomes[0])
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT n FROM `+charges+` WHERE id = 'pay-1'`).Scan(&n); err != nil {
		log.Fatal(err)
	}
	fmt.Println("pay-1 charged", n, "time, handler calls:", c.Calls("pay-1"))
	// Output:
	// offset 41 applied
	// offset 41 duplicate
	// offset 42 duplicate
	// pay-1 charged 1 time, handler calls: 1
}

// What a transaction enqueued, read back inside it before it commits.
func ExampleEnqueuedTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEMKIT_TEST_DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	s, err := idemtest.CreateSchema(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Drop(ctx)
	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		log.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		ids, err := store.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders", Key: []byte("order-42"), Value: []byte(`{"status":"paid"}`)})
		if err != nil {
			return err
		}
		got, err := idemtest.EnqueuedTx(ctx, tx, store)
		if err != nil {
			return err
		}
		for _, e := range got {
			fmt.Printf("%s %s %s, same ID: %v\n", e.Topic, e.Key, e.Value, e.ID == ids[0])
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// orders order-42 {"status":"paid"}, same ID: true
}
