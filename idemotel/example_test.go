package idemotel_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/idemtest"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/monitor"
)

// A consumer with metrics on /metrics (OpenTelemetry's Prometheus exporter)
// and traces through the program's tracer provider.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	tp := sdktrace.NewTracerProvider() // add your exporter: sdktrace.WithBatcher(…)
	defer tp.Shutdown(context.Background())
	tel, metrics, err := idemotel.NewPrometheus(&idemotel.Config{TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/metrics", metrics)
	go func() { log.Println(http.ListenAndServe("127.0.0.1:9464", nil)) }()
	brokers := []string{"127.0.0.1:9092"}
	cfg := consumer.Config{
		Kafka: kafkaconn.Config{Brokers: brokers}, Topic: "payments", GroupID: "order-service",
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			// ctx carries the transaction's span: spans started here are its children.
			_, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, string(msg.Key))
			return err
		}),
	}
	c, err := tel.Consumer(&cfg) // spans, counters and histograms
	if err != nil {
		log.Fatal(err)
	}
	wcfg := &dlq.WriterConfig{Kafka: kafkaconn.Config{Brokers: brokers}, Group: "order-service", Pool: pool}
	if err := c.DeadLetterWriter(wcfg); err != nil { // write failures counted
		log.Fatal(err)
	}
	dead, err := dlq.NewWriter(wcfg)
	if err != nil {
		log.Fatal(err)
	}
	defer dead.Close()
	cfg.OnFailure = c.DeadLetters(dead) // dead.OnFailure, letters counted
	r, err := consumer.New(pool, &cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Observe(r); err != nil { // lag, position, parked, ages, retention
		log.Fatal(err)
	}
	defer c.Close()
	if err := r.Run(ctx); err != nil {
		log.Fatal(err)
	}
}

// A producer retry sends payment pay-1 twice: the counters say two applied
// and one duplicate, and each of the three transactions has a span.
func ExampleTelemetry_Consumer() {
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
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll}
	var msgs []kafka.Message
	for _, id := range []string{"pay-1", "pay-2", "pay-1"} { // the third is a producer retry
		msgs = append(msgs, kafka.Message{Value: []byte(id), Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		log.Fatal(err)
	}
	_ = w.Close()

	// In-memory telemetry, to print it.
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		log.Fatal(err)
	}

	runCtx, stop := context.WithCancel(ctx)
	seen := 0
	cfg := consumer.Config{
		Kafka: kafkaconn.Config{Brokers: brokers}, Topic: topic, GroupID: topic + "-payments", Store: store, BatchSize: 1,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			return nil // the business write goes here, in tx
		}),
		Observers: []consumer.Observer{stopAfter(func() {
			if seen++; seen == 3 {
				stop()
			}
		})},
	}
	c, err := tel.Consumer(&cfg) // adds its own observer before the one above
	if err != nil {
		log.Fatal(err)
	}
	r, err := consumer.New(pool, &cfg)
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Observe(r); err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := r.Run(runCtx); err != nil {
		log.Fatal(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "idemkit.consumer.messages" {
				for _, p := range sum.DataPoints {
					outcome, _ := p.Attributes.Value("outcome")
					lines = append(lines, fmt.Sprintf("%s %s: %d", m.Name, outcome.AsString(), p.Value))
				}
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	fmt.Println("spans:", len(spans.Ended()))
	// Output:
	// idemkit.consumer.messages applied: 2
	// idemkit.consumer.messages duplicate: 1
	// idemkit.consumer.messages failed: 0
	// idemkit.consumer.messages parked: 0
	// spans: 3
}

// A producer stamps the current trace context into the message's headers;
// the consumer's span continues that trace.
func ExampleTelemetry_Inject() {
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	ctx, span := tp.Tracer("checkout").Start(context.Background(), "pay")
	defer span.End()

	msg := kafka.Message{Value: []byte("pay-1"), Headers: []kafka.Header{{Key: "message-id", Value: []byte("pay-1")}}}
	tel.Inject(ctx, &msg.Headers)
	for _, h := range msg.Headers {
		fmt.Println(h.Key)
	}
	// Output:
	// message-id
	// traceparent
}

// stopAfter is an OutcomeObserver that calls f at each outcome.
type stopAfter func()

func (f stopAfter) Outcome(context.Context, *consumer.OutcomeEvent) { f() }

// A Monitor: the lag, the outbox, the parked and dead-lettered messages
// from the tables, collected in the background, exported as gauges.
func ExampleTelemetry_Monitor() {
	run := func(ctx context.Context, tel *idemotel.Telemetry, pool *pgxpool.Pool, brokers []string, w *dlq.Writer) error {
		mon, err := tel.Monitor(pool, &idemotel.MonitorConfig{
			Config:           monitor.Config{Kafka: kafkaconn.Config{Brokers: brokers}},
			Retention:        30 * 24 * time.Hour, // what your purge promises (default 7 days)
			DeadLetterTopics: w.Topics("payments"),
		})
		if err != nil {
			return err
		}
		defer mon.Close()
		go mon.Run(ctx)
		return nil
	}
	_ = run
}

// Everything the module offers for one consumer: spans, counters and
// histograms, dead letters counted, trace IDs in logs, the runner's gauges
// and a Monitor's.
func ExampleTelemetry_Consumer_all() {
	run := func(ctx context.Context, tp *sdktrace.TracerProvider, mp *sdkmetric.MeterProvider, cfg consumer.Config,
		w *dlq.Writer, pool *pgxpool.Pool) {
		tel, _ := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
		c, _ := tel.Consumer(&cfg)                                                      // a span per transaction, counters, histograms (an observer of its own)
		cfg.OnFailure = c.DeadLetters(w)                                                // a dlq.Writer, its writes counted
		cfg.Logger = slog.New(idemotel.LogHandler(slog.NewJSONHandler(os.Stderr, nil))) // trace_id in logs
		r, _ := consumer.New(pool, &cfg)
		_ = c.Observe(r) // gauges of the partitions r holds
		mon, _ := tel.Monitor(pool, &idemotel.MonitorConfig{Config: monitor.Config{Kafka: cfg.Kafka}})
		go mon.Run(ctx) // lag, parked, backlog, dead, stuck, retention: from the tables, every 15s
	}
	_ = run
}
