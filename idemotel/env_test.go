package idemotel_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// env is one test's topic, schema, effect table and in-memory telemetry.
type env struct {
	t       *testing.T
	topic   string
	group   string
	db      *testenv.DB
	store   *dedup.Store
	effects string
	spans   *tracetest.SpanRecorder
	tp      *sdktrace.TracerProvider
	reader  *sdkmetric.ManualReader
	tel     *idemotel.Telemetry
}

func newEnv(t *testing.T, partitions int) *env {
	t.Helper()
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		if err := testenv.Migrate(ctx, pool, schema); err != nil {
			return err
		}
		_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{schema, "effects"}.Sanitize()+` (
			id text PRIMARY KEY, runs int NOT NULL)`)
		return err
	})
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, topic: testenv.NewTopic(t, partitions), group: testenv.Name(t, "g"), db: db, store: store,
		effects: db.Table("effects"), spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	t.Cleanup(func() {
		_ = e.tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	e.tel, err = idemotel.New(&idemotel.Config{TracerProvider: e.tp, MeterProvider: mp})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// msg is a test message with an ID header.
func msg(id, key string) kafka.Message {
	return kafka.Message{Key: []byte(key), Value: []byte(id),
		Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}
}

// produce writes msgs to the topic, in order, acknowledged by all replicas.
func (e *env) produce(msgs ...kafka.Message) {
	e.t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(e.t)...), Topic: e.topic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		e.t.Fatalf("produce: %v", err)
	}
}

// effect is the business write: one row per message ID, counting runs.
func (e *env) effect(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+e.effects+` (id, runs) VALUES ($1, 1)
		ON CONFLICT (id) DO UPDATE SET runs = `+e.effects+`.runs + 1`, m.ID)
	return err
}

// config returns a runner config; handler defaults to effect.
func (e *env) config(handler consumer.HandlerFunc) *consumer.Config {
	if handler == nil {
		handler = e.effect
	}
	return &consumer.Config{
		Kafka: testenv.Kafka(e.t), Topic: e.topic, GroupID: e.group,
		Store: e.store, Handler: handler,
		Retry:             retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond},
		SessionTimeout:    6 * time.Second,
		HeartbeatInterval: 500 * time.Millisecond,
		RebalanceTimeout:  3 * time.Second,
		Logger:            slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

// run starts r and returns a function that stops it and returns Run's error.
func run(t *testing.T, r *consumer.Runner) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	var once sync.Once
	var result error
	stop = func() error {
		once.Do(func() { cancel(); result = <-errc })
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// outcomes is a user's own Outcome hook (the telemetry must chain it): it
// signals when want messages reached a final outcome.
type outcomes struct {
	mu     sync.Mutex
	byKind map[consumer.Outcome]int
	want   int
	done   chan struct{}
}

func newOutcomes(want int) *outcomes {
	return &outcomes{byKind: map[consumer.Outcome]int{}, want: want, done: make(chan struct{})}
}

func (o *outcomes) hook(_ context.Context, _ *consumer.Message, oc consumer.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.byKind[oc]++
	if n := o.byKind[consumer.Applied] + o.byKind[consumer.Duplicate] + o.byKind[consumer.Failed]; n == o.want {
		close(o.done)
	}
}

func (o *outcomes) count(oc consumer.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.byKind[oc]
}

func wait(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(45 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// collect reads every metric.
func (e *env) collect() metricdata.ResourceMetrics {
	e.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		e.t.Fatal(err)
	}
	return rm
}

// find returns the metric named name.
func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// points returns the value of each data point of an int64 sum or gauge, or
// the count of a histogram, by its attributes ("k=v,k=v", sorted).
func points(t *testing.T, rm metricdata.ResourceMetrics, name string) map[string]float64 {
	t.Helper()
	m, ok := find(rm, name)
	if !ok {
		return nil
	}
	out := map[string]float64{}
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out[attrString(p.Attributes.ToSlice())] = float64(p.Value)
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			out[attrString(p.Attributes.ToSlice())] = float64(p.Value)
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			out[attrString(p.Attributes.ToSlice())] = p.Value
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out[attrString(p.Attributes.ToSlice())] = float64(p.Count)
		}
	case metricdata.Histogram[int64]:
		for _, p := range d.DataPoints {
			out[attrString(p.Attributes.ToSlice())] = float64(p.Count)
		}
	default:
		t.Fatalf("%s: unexpected data %T", name, m.Data)
	}
	return out
}

// attrString renders attributes as "k=v,k=v" (sorted by key, as an
// attribute set's are).
func attrString(kvs []attribute.KeyValue) string {
	parts := make([]string, len(kvs))
	for i, kv := range kvs {
		parts[i] = string(kv.Key) + "=" + kv.Value.Emit()
	}
	return strings.Join(parts, ",")
}

// lbl is attrString of key, value pairs.
func lbl(kv ...string) string {
	a := make([]attribute.KeyValue, 0, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		a = append(a, attribute.String(kv[i], kv[i+1]))
	}
	set := attribute.NewSet(a...)
	return attrString(set.ToSlice())
}
