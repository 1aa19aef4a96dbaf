package outbox_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/idemtest"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// A business transaction writes its row and its event together; the relay
// publishes the event after the commit, with the stable ID as a header.
func ExampleStore_EnqueueTx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("IDEMKIT_TEST_DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	s, err := idemtest.CreateSchema(ctx, pool) // a fresh schema with idemkit's tables
	if err != nil {
		panic(err)
	}
	defer s.Drop(ctx)
	brokers := strings.Split(os.Getenv("IDEMKIT_TEST_KAFKA_BROKERS"), ",")
	topic, dropTopic, err := idemtest.CreateTopic(ctx, brokers, 1)
	if err != nil {
		panic(err)
	}
	defer dropTopic(ctx)

	store, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: s.Name}})
	if err != nil {
		panic(err)
	}
	var ids []string
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... the business writes, in tx ...
		ids, err = store.EnqueueTx(ctx, tx, outbox.Message{
			Topic: topic, Key: []byte("order-42"), Value: []byte(`{"status":"paid"}`),
		})
		return err
	})
	if err != nil {
		panic(err)
	}

	published := make(chan []outbox.Record, 1)
	relay, err := outbox.NewRelay(pool, store, &outbox.RelayConfig{
		Kafka:     kafkaconn.Config{Brokers: brokers},
		Observers: []outbox.Observer{&testobs.Outbox{OnPublished: func(recs []outbox.Record) { published <- recs }}},
	})
	if err != nil {
		panic(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	recs := <-published
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	fmt.Println("published:", len(recs), "same ID:", recs[0].ID == ids[0])

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	m, err := r.ReadMessage(ctx)
	if err != nil {
		panic(err)
	}
	for _, h := range m.Headers {
		if h.Key == outbox.HeaderID {
			fmt.Println("header carries the ID:", string(h.Value) == ids[0])
		}
	}
	fmt.Printf("%s %s\n", m.Key, m.Value)
	// Output:
	// published: 1 same ID: true
	// header carries the ID: true
	// order-42 {"status":"paid"}
}
