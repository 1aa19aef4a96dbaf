// Command quickstart is the visible produce → consume → PostgreSQL scenario
// that scripts/demo runs against the development servers: it produces keyed
// order events to a new topic, consumes them with a kafka-go consumer group,
// writes each to a Postgres table in a transaction, commits the offset only
// after that, and prints what happened.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	dbURL := env("IDEMKIT_DATABASE_URL", "postgres://postgres@127.0.0.1:54329/idemkit?sslmode=disable")
	brokers := strings.Split(env("IDEMKIT_KAFKA_BROKERS", "127.0.0.1:19092"), ",")

	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS quickstart_orders (
		order_id text PRIMARY KEY, amount bigint NOT NULL, part int NOT NULL, off bigint NOT NULL)`); err != nil {
		return fmt.Errorf("create demo table: %w", err)
	}

	topic := fmt.Sprintf("quickstart-%d", time.Now().UnixNano())
	client := &kafka.Client{Addr: kafka.TCP(brokers...)}
	if _, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 3, ReplicationFactor: 1}}}); err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	fmt.Printf("created topic %s (3 partitions)\n", topic)

	const n = 12
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll}
	var msgs []kafka.Message
	for i := range n {
		id := fmt.Sprintf("order-%03d", 840+i)
		msgs = append(msgs, kafka.Message{Key: []byte(id), Value: []byte(fmt.Sprint(1000 * (i + 1)))})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("close producer: %w", err)
	}
	fmt.Printf("produced %d order events (acks from all replicas)\n", n)

	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, GroupID: topic + "-group", Topic: topic, StartOffset: kafka.FirstOffset})
	defer r.Close()
	for i := range n {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return fmt.Errorf("fetch: %w", err)
		}
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO quickstart_orders (order_id, amount, part, off) VALUES ($1, $2, $3, $4)
				ON CONFLICT (order_id) DO NOTHING`, string(m.Key), string(m.Value), m.Partition, m.Offset)
			return err
		})
		if err != nil {
			return fmt.Errorf("write %s: %w", m.Key, err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			return fmt.Errorf("commit offset: %w", err)
		}
		fmt.Printf("  %2d. partition %d offset %d  %s amount %s → committed in Postgres, then offset committed\n",
			i+1, m.Partition, m.Offset, m.Key, m.Value)
	}
	var count, total int64
	if err := pool.QueryRow(ctx, `SELECT count(*), coalesce(sum(amount), 0) FROM quickstart_orders WHERE order_id LIKE 'order-%'`).Scan(&count, &total); err != nil {
		return err
	}
	fmt.Printf("postgres now holds %d orders, total amount %d\n", count, total)
	return nil
}
