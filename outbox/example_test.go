package outbox_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/outbox"
)

// A business transaction writes its row and its event together; the relay
// publishes the event after the commit, with the stable ID as a header.
func ExampleStore_EnqueueTx() {
	ctx := context.Background()
	pool, schema, topic, cleanup := exampleEnv() // a migrated schema and a topic on the test servers
	defer cleanup()

	store, err := outbox.New(&outbox.Config{Schema: schema})
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
		Brokers: strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ","),
		Hooks:   outbox.Hooks{Published: func(recs []outbox.Record) { published <- recs }},
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

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ","), Topic: topic, MaxWait: 100 * time.Millisecond})
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

// exampleEnv returns, for Example functions (which get no testing.TB), a
// pool with an empty search_path, a migrated schema and a one-partition
// topic; cleanup drops them.
func exampleEnv() (pool *pgxpool.Pool, schema, topic string, cleanup func()) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(os.Getenv(testenv.EnvDatabaseURL))
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	suffix := strings.ToLower(rand.Text()[:12])
	schema, topic = "ex_"+suffix, "idemkit_example_"+suffix
	if err := migrateUp(ctx, pool, schema); err != nil {
		panic(err)
	}
	client := &kafka.Client{Addr: kafka.TCP(strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ",")...)}
	if _, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}}); err != nil {
		panic(err)
	}
	if err := testenv.WaitTopic(ctx, client, topic, 1); err != nil {
		panic(err)
	}
	return pool, schema, topic, func() {
		ctx := context.Background()
		_, _ = client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
		if _, err := pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			panic(err)
		}
		pool.Close()
	}
}
