package idemotel_test

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
)

var (
	benchBatched    = flag.Int("idemotel.batched", 40000, "messages per run of BenchmarkOverhead/batched")
	benchPerMessage = flag.Int("idemotel.permessage", 4000, "messages per run of BenchmarkOverhead/per-message")
)

// discard is a span exporter that drops what it gets: the cost measured is
// the instrumentation's and the SDK's, not a backend's.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkOverhead measures the consumer's throughput with telemetry off
// (no hooks, no middleware of this package) and on (every span sampled and
// batched to a discarding exporter, every metric recorded into the SDK), over
// the same messages — each carrying a traceparent, so that spans have
// parents and batch spans have links — in runs that alternate off and on,
// each run a fresh consumer group and dedup scope from the start of the
// topic. A run is timed from its first transaction to its last outcome
// (joining the group is left out). Each iteration is one off and one on run;
// the reported on/off is the ratio of the total throughputs:
//
//	go test -run '^$' -bench Overhead -benchtime 5x ./idemotel
func BenchmarkOverhead(b *testing.B) {
	for _, mode := range []struct {
		name  string
		batch int
		n     *int
	}{{"batched", 0, benchBatched}, {"per-message", 1, benchPerMessage}} {
		b.Run(mode.name, func(b *testing.B) {
			benchmarkOverhead(b, mode.batch, *mode.n)
		})
	}
}

func benchmarkOverhead(b *testing.B, batch, n int) {
	db := testenv.NewDB(b, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		if err := testenv.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "effects"}.Sanitize()+` (
			consumer text, id text, PRIMARY KEY (consumer, id))`)
		return err
	})
	effects := db.Table("effects")
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		b.Fatal(err)
	}
	const partitions = 2
	topic := testenv.NewTopic(b, partitions)

	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}

	// The messages, each produced in a span of its own.
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(b)...), Topic: topic, Balancer: &kafka.RoundRobin{},
		RequiredAcks: kafka.RequireAll, BatchSize: 1000, BatchTimeout: time.Millisecond}
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		_, span := tp.Tracer("producer").Start(context.Background(), "send")
		id := "m" + strconv.Itoa(i)
		msgs[i] = kafka.Message{Key: []byte(id), Value: []byte(id), Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}
		tel.Inject(trace.ContextWithSpan(context.Background(), span), &msgs[i].Headers)
		span.End()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		b.Fatal(err)
	}
	_ = w.Close()

	var runs int
	// run consumes the n messages with a fresh group and dedup scope and
	// returns the time from the first transaction to the last outcome.
	run := func(on bool) time.Duration {
		runs++
		name := fmt.Sprintf("bench-%s-%d", testenv.Name(b, "g"), runs)
		var first atomic.Int64
		var done atomic.Int64
		finished := make(chan struct{})
		var once sync.Once
		cfg := consumer.Config{
			Kafka: testenv.Kafka(b), Topic: topic, GroupID: name, Store: store, BatchSize: batch,
			Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
				_, err := tx.Exec(ctx, `INSERT INTO `+effects+` (consumer, id) VALUES ($1, $2)`, name, m.ID)
				return err
			}),
			Logger: slog.New(slog.DiscardHandler),
		}
		testobs.Of(&cfg).OnTxStart = func(ctx context.Context, _ []*consumer.Message, _ int) context.Context {
			first.CompareAndSwap(0, time.Now().UnixNano())
			return nil
		}
		testobs.Of(&cfg).OnOutcome = func(context.Context, *consumer.Message, consumer.Outcome) {
			if done.Add(1) == int64(n) {
				once.Do(func() { close(finished) })
			}
		}
		if on {
			c, err := tel.Consumer(&cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			r, err := consumer.New(db.Pool, &cfg)
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Observe(r); err != nil {
				b.Fatal(err)
			}
			return timeRun(b, r, finished, &first)
		}
		r, err := consumer.New(db.Pool, &cfg)
		if err != nil {
			b.Fatal(err)
		}
		return timeRun(b, r, finished, &first)
	}

	var off, on time.Duration
	b.ResetTimer()
	for i := range b.N {
		var dOff, dOn time.Duration
		if i%2 == 0 {
			dOff = run(false)
			dOn = run(true)
		} else {
			dOn = run(true)
			dOff = run(false)
		}
		off, on = off+dOff, on+dOn
		b.Logf("round %d: off %v, on %v, on/off throughput %.3f", i, dOff.Round(time.Millisecond), dOn.Round(time.Millisecond),
			dOff.Seconds()/dOn.Seconds())
		// A scrape per round, as a Prometheus server would do.
		rm := new(metricdata.ResourceMetrics)
		_ = reader.Collect(context.Background(), rm)
	}
	b.StopTimer()
	total := float64(n * b.N)
	b.ReportMetric(total/off.Seconds(), "msgs/s-off")
	b.ReportMetric(total/on.Seconds(), "msgs/s-on")
	b.ReportMetric(off.Seconds()/on.Seconds(), "on/off")
}

// timeRun runs r until finished closes and returns the time from the first
// transaction to then.
func timeRun(b *testing.B, r *consumer.Runner, finished chan struct{}, first *atomic.Int64) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	select {
	case <-finished:
	case err := <-errc:
		cancel()
		b.Fatalf("Run: %v", err)
	case <-time.After(5 * time.Minute):
		cancel()
		<-errc
		b.Fatal("run timed out")
	}
	d := time.Since(time.Unix(0, first.Load()))
	cancel()
	if err := <-errc; err != nil {
		b.Fatalf("Run: %v", err)
	}
	return d
}

// BenchmarkObserver measures the CPU cost of the telemetry per transaction,
// without servers: TxStart, the handler middleware, TxEnd and the Outcome
// events, as the runner sends them, for one message and for a batch of 500
// (every message with a traceparent), with the SDK recording every span and
// metric.
func BenchmarkObserver(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int{1, 500} {
		b.Run(fmt.Sprintf("messages=%d", size), func(b *testing.B) {
			cfg := consumer.Config{Topic: "orders", GroupID: "bench",
				Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })}
			if _, err := tel.Consumer(&cfg); err != nil {
				b.Fatal(err)
			}
			handler := cfg.Middleware[0](cfg.Handler)
			obs := observerOf(b, &cfg)
			msgs := make([]*consumer.Message, size)
			for i := range msgs {
				_, span := tp.Tracer("producer").Start(context.Background(), "send")
				m := &consumer.Message{ID: "m" + strconv.Itoa(i)}
				m.Topic, m.Offset = "orders", int64(i)
				m.Headers = []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(m.ID)}}
				tel.Inject(trace.ContextWithSpan(context.Background(), span), &m.Headers)
				span.End()
				msgs[i] = m
			}
			outcomes := make([]consumer.Outcome, size)
			for i := range outcomes {
				outcomes[i] = consumer.Applied
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				ctx := obs.TxStart(context.Background(), &consumer.TxStartEvent{Messages: msgs, Attempt: 1})
				for _, m := range msgs {
					_ = handler.Handle(ctx, nil, m)
				}
				obs.TxEnd(ctx, &consumer.TxEndEvent{Messages: msgs, Attempt: 1, Outcomes: outcomes, Duration: time.Millisecond})
				for _, m := range msgs {
					obs.Outcome(ctx, &consumer.OutcomeEvent{Message: m, Outcome: consumer.Applied})
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/msg")
		})
	}
}

// BenchmarkObserverMetricsOnly is BenchmarkObserver with traces off (the no-op
// tracer provider).
func BenchmarkObserverMetricsOnly(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tracenoop.NewTracerProvider(), MeterProvider: mp})
	if err != nil {
		b.Fatal(err)
	}
	cfg := consumer.Config{Topic: "orders", GroupID: "bench",
		Handler: consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })}
	if _, err := tel.Consumer(&cfg); err != nil {
		b.Fatal(err)
	}
	msgs := []*consumer.Message{{ID: "m"}}
	outcomes := []consumer.Outcome{consumer.Applied}
	handler := cfg.Middleware[0](cfg.Handler)
	obs := observerOf(b, &cfg)
	b.ReportAllocs()
	for b.Loop() {
		ctx := obs.TxStart(context.Background(), &consumer.TxStartEvent{Messages: msgs, Attempt: 1})
		_ = handler.Handle(ctx, nil, msgs[0])
		obs.TxEnd(ctx, &consumer.TxEndEvent{Messages: msgs, Attempt: 1, Outcomes: outcomes, Duration: time.Millisecond})
		obs.Outcome(ctx, &consumer.OutcomeEvent{Message: msgs[0], Outcome: consumer.Applied})
	}
}

// txOutcomeObserver is what the telemetry's consumer observer is at least.
type txOutcomeObserver interface {
	consumer.TxObserver
	consumer.OutcomeObserver
}

// observerOf returns the observer the telemetry put in cfg, to call as the
// runner does.
func observerOf(tb testing.TB, cfg *consumer.Config) txOutcomeObserver {
	tb.Helper()
	if len(cfg.Observers) == 0 {
		tb.Fatal("the telemetry registered no observer")
	}
	obs, ok := cfg.Observers[0].(txOutcomeObserver)
	if !ok {
		tb.Fatalf("observer %T takes no transactions and outcomes", cfg.Observers[0])
	}
	return obs
}
