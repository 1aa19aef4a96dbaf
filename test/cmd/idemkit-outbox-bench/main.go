// Command idemkit-outbox-bench measures the outbox relay against real
// servers: publish throughput with 1 and 3 relays draining a pre-filled
// outbox, and enqueue→publish latency (commit of the business transaction to
// Kafka's acknowledgement) under a steady load. It prints a Markdown table.
//
//	eval "$(scripts/dev env)"
//	go run ./test/cmd/idemkit-outbox-bench
//
// It reads IDEMKIT_TEST_DATABASE_URL and IDEMKIT_TEST_KAFKA_BROKERS, works in
// a schema and topics of its own, and removes them afterwards.
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-outbox-bench:", err)
		os.Exit(1)
	}
}

type options struct {
	messages, keys, batch, rate, partitions int
	duration                                time.Duration
}

func run() error {
	var o options
	flag.IntVar(&o.messages, "messages", 50000, "messages per throughput run")
	flag.IntVar(&o.keys, "keys", 1000, "distinct keys")
	flag.IntVar(&o.batch, "batch", 1000, "relay batch size")
	flag.IntVar(&o.rate, "rate", 1000, "messages per second in the latency run")
	flag.IntVar(&o.partitions, "partitions", 6, "partitions of the topic")
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "length of the latency run")
	flag.Parse()

	url := os.Getenv(testenv.EnvDatabaseURL)
	brokers := strings.Split(os.Getenv(testenv.EnvKafkaBrokers), ",")
	if url == "" || brokers[0] == "" {
		return errors.New(testenv.Instruction)
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.MaxConns = 16
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 30 * time.Second}

	type row struct{ what, value string }
	var table []row
	for _, relays := range []int{1, 3} {
		rate, err := throughput(ctx, pool, client, brokers, o, relays)
		if err != nil {
			return fmt.Errorf("throughput with %d relays: %w", relays, err)
		}
		table = append(table, row{fmt.Sprintf("throughput, %d relay(s), %d msgs over %d keys, batch %d",
			relays, o.messages, o.keys, o.batch), fmt.Sprintf("%.0f msgs/s", rate)})
	}
	p50, p99, n, err := latency(ctx, pool, client, brokers, o)
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	table = append(table,
		row{fmt.Sprintf("enqueue→publish p50 at %d msgs/s (1 relay, %d msgs)", o.rate, n), fmtDur(p50)},
		row{fmt.Sprintf("enqueue→publish p99 at %d msgs/s (1 relay, %d msgs)", o.rate, n), fmtDur(p99)})

	fmt.Println("| measure | result |")
	fmt.Println("| --- | --- |")
	for _, r := range table {
		fmt.Printf("| %s | %s |\n", r.what, r.value)
	}
	return nil
}

func fmtDur(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// setup makes a migrated schema and a topic; cleanup removes both.
func setup(ctx context.Context, pool *pgxpool.Pool, client *kafka.Client, partitions int) (*outbox.Store, string, func(), error) {
	suffix := strings.ToLower(rand.Text()[:10])
	schema, topic := "bench_"+suffix, "idemkit_bench_"+suffix
	m, err := migrate.New(pool, &migrate.Config{Schema: schema})
	if err != nil {
		return nil, "", nil, err
	}
	cleanup := func() {
		c := context.WithoutCancel(ctx)
		_, _ = client.DeleteTopics(c, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
		_, _ = pool.Exec(c, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}
	if _, err := m.Up(ctx); err != nil {
		cleanup()
		return nil, "", nil, err
	}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err == nil {
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		err = testenv.WaitTopic(wctx, client, topic, partitions)
		cancel()
	}
	if err != nil {
		cleanup()
		return nil, "", nil, err
	}
	store, err := outbox.New(&outbox.Config{Schema: schema})
	if err != nil {
		cleanup()
		return nil, "", nil, err
	}
	return store, topic, cleanup, nil
}

// startRelays runs n relays until stop is called.
func startRelays(ctx context.Context, pool *pgxpool.Pool, store *outbox.Store, brokers []string,
	n, batch int, hooks outbox.Hooks) (stop func() error, err error) {
	ctx, cancel := context.WithCancel(ctx)
	// A transport of the run's own: its metadata cache knows the new topic.
	tr := &kafka.Transport{}
	errs := make(chan error, n)
	for range n {
		r, err := outbox.NewRelay(pool, store, &outbox.RelayConfig{Brokers: brokers, Transport: tr, BatchSize: batch,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), Hooks: hooks})
		if err != nil {
			cancel()
			return nil, err
		}
		go func() { errs <- r.Run(ctx) }()
	}
	return func() error {
		cancel()
		var all []error
		for range n {
			all = append(all, <-errs)
		}
		tr.CloseIdleConnections()
		return errors.Join(all...)
	}, nil
}

func throughput(ctx context.Context, pool *pgxpool.Pool, client *kafka.Client, brokers []string,
	o options, relays int) (float64, error) {
	store, topic, cleanup, err := setup(ctx, pool, client, o.partitions)
	if err != nil {
		return 0, err
	}
	defer cleanup()
	// Fill the outbox first, in transactions of 1000.
	for i := 0; i < o.messages; i += 1000 {
		msgs := make([]outbox.Message, 0, 1000)
		for j := i; j < min(i+1000, o.messages); j++ {
			msgs = append(msgs, outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "key-%d", j%o.keys),
				Value: fmt.Appendf(nil, `{"n":%d,"payload":"%s"}`, j, strings.Repeat("x", 100))})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.EnqueueTx(ctx, tx, msgs...)
			return err
		}); err != nil {
			return 0, err
		}
	}
	var published atomic.Int64
	done := make(chan struct{})
	var once sync.Once
	start := time.Now()
	stop, err := startRelays(ctx, pool, store, brokers, relays, o.batch, outbox.Hooks{
		Published: func(recs []outbox.Record) {
			if published.Add(int64(len(recs))) >= int64(o.messages) {
				once.Do(func() { close(done) })
			}
		}})
	if err != nil {
		return 0, err
	}
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
	}
	elapsed := time.Since(start)
	if err := stop(); err != nil {
		return 0, err
	}
	if n := published.Load(); n < int64(o.messages) {
		return 0, fmt.Errorf("only %d of %d published", n, o.messages)
	}
	return float64(o.messages) / elapsed.Seconds(), nil
}

func latency(ctx context.Context, pool *pgxpool.Pool, client *kafka.Client, brokers []string,
	o options) (p50, p99 time.Duration, n int, err error) {
	store, topic, cleanup, err := setup(ctx, pool, client, o.partitions)
	if err != nil {
		return 0, 0, 0, err
	}
	defer cleanup()
	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		lat       []time.Duration
	)
	stop, err := startRelays(ctx, pool, store, brokers, 1, o.batch, outbox.Hooks{
		AfterPublish: func(_ context.Context, recs []outbox.Record) {
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			for _, r := range recs {
				if t, ok := committed[r.ID]; ok {
					lat = append(lat, now.Sub(t))
					delete(committed, r.ID)
				}
			}
		}})
	if err != nil {
		return 0, 0, 0, err
	}
	// 100 transactions per second of rate/100 messages each, on a fixed
	// schedule.
	const tick = 10 * time.Millisecond
	per := max(o.rate/100, 1)
	next := time.Now()
	end := next.Add(o.duration)
	i := 0
	for next.Before(end) {
		time.Sleep(time.Until(next))
		next = next.Add(tick)
		msgs := make([]outbox.Message, per)
		for j := range msgs {
			msgs[j] = outbox.Message{Topic: topic, Key: fmt.Appendf(nil, "key-%d", i%o.keys), Value: fmt.Appendf(nil, "%d", i)}
			i++
		}
		// The clock starts just before COMMIT (so the commit's own time
		// counts as latency), and before the relay can possibly see the rows.
		tx, err := pool.Begin(ctx)
		if err != nil {
			return 0, 0, 0, err
		}
		ids, err := store.EnqueueTx(ctx, tx, msgs...)
		if err != nil {
			_ = tx.Rollback(ctx)
			return 0, 0, 0, err
		}
		now := time.Now()
		mu.Lock()
		for _, id := range ids {
			committed[id] = now
		}
		mu.Unlock()
		if err := tx.Commit(ctx); err != nil {
			return 0, 0, 0, err
		}
	}
	// Let the last ones through.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		left := len(committed)
		mu.Unlock()
		if left == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := stop(); err != nil {
		return 0, 0, 0, err
	}
	mu.Lock()
	defer mu.Unlock()
	if len(committed) > 0 || len(lat) == 0 {
		return 0, 0, 0, fmt.Errorf("%d messages not published", len(committed))
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[len(lat)*99/100], len(lat), nil
}
