package idemotel

import (
	"fmt"
	"net/http"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
)

// ScopeName is the instrumentation scope of every tracer and meter the
// package uses (the otel_scope_name label of its Prometheus series).
const ScopeName = "github.com/idemkit/idemkit/idemotel"

// ErrInvalidConfig is wrapped by every configuration error of the package.
var ErrInvalidConfig = fmt.Errorf("idemotel: %w", idemkit.ErrInvalidConfig)

// Config configures a Telemetry. Every field is optional.
type Config struct {
	// TracerProvider creates the spans; traces are on as soon as it (or the
	// global provider) is a real one. Pass noop.NewTracerProvider() (package
	// go.opentelemetry.io/otel/trace/noop) to turn traces off: the consumer
	// then neither starts spans nor reads trace headers. Defaults to
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider creates the instruments; likewise for metrics. Defaults
	// to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator reads the trace context of consumed messages from their
	// Kafka headers and writes it into produced ones (Inject). The global
	// propagator is not the default: a consumer must not lose its
	// producers' traces because a program forgot otel.SetTextMapPropagator.
	// Defaults to W3C Trace Context and W3C Baggage (headers "traceparent",
	// "tracestate", "baggage").
	Propagator propagation.TextMapPropagator
}

// Telemetry holds the tracer, the propagator and the instruments that the
// adapters of the package share: one per program (or per MeterProvider),
// used for every consumer, writer and reprocessor. It is safe for concurrent
// use.
//
// Each component gets one method that wires the telemetry into its
// configuration: Consumer, Reprocessor, Relay, HTTP and Webhook.
type Telemetry struct {
	cfg      Config
	tracer   trace.Tracer
	meter    metric.Meter
	prop     propagation.TextMapPropagator
	noTraces bool // the TracerProvider is the no-op one: no span, no header read
	consumer consumerInstruments
	dlq      dlqInstruments
	outbox   outboxInstruments
	http     httpInstruments
	webhook  webhookInstruments
	monitor  monitorInstruments

	// observed are the runners Consumer.Observe watches, by consumer name
	// and topic: their partitions' lag and position are theirs, so that a
	// Monitor in the same process leaves those partitions out.
	observedMu sync.Mutex
	observed   map[[2]string][]*consumer.Runner
}

// heldHere returns the partitions of consumer name on topic that runners
// observed in this process hold now.
func (t *Telemetry) heldHere(name, topic string) map[int]bool {
	t.observedMu.Lock()
	runners := slices.Clone(t.observed[[2]string{name, topic}])
	t.observedMu.Unlock()
	if len(runners) == 0 {
		return nil
	}
	held := map[int]bool{}
	for _, r := range runners {
		for _, p := range r.Partitions() {
			held[p.Partition] = true
		}
	}
	return held
}

func (t *Telemetry) observe(name, topic string, r *consumer.Runner, on bool) {
	t.observedMu.Lock()
	defer t.observedMu.Unlock()
	k := [2]string{name, topic}
	if on {
		if t.observed == nil {
			t.observed = map[[2]string][]*consumer.Runner{}
		}
		t.observed[k] = append(t.observed[k], r)
		return
	}
	t.observed[k] = slices.DeleteFunc(t.observed[k], func(x *consumer.Runner) bool { return x == r })
}

// New validates cfg (nil means every default), creates the instruments and
// returns a Telemetry.
func New(cfg *Config) (*Telemetry, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	t := &Telemetry{
		cfg:    c,
		tracer: c.TracerProvider.Tracer(ScopeName, trace.WithSchemaURL(semconv.SchemaURL)),
		meter:  c.MeterProvider.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL)),
		prop:   c.Propagator,
	}
	_, t.noTraces = c.TracerProvider.(noop.TracerProvider)
	var err error
	if t.consumer, err = newConsumerInstruments(t.meter); err != nil {
		return nil, fmt.Errorf("idemotel: consumer instruments: %w", err)
	}
	if t.dlq, err = newDLQInstruments(t.meter); err != nil {
		return nil, fmt.Errorf("idemotel: dlq instruments: %w", err)
	}
	if t.outbox, err = newOutboxInstruments(t.meter); err != nil {
		return nil, fmt.Errorf("idemotel: outbox instruments: %w", err)
	}
	if t.http, err = newHTTPInstruments(t.meter); err != nil {
		return nil, fmt.Errorf("idemotel: http instruments: %w", err)
	}
	if t.webhook, err = newWebhookInstruments(t.meter); err != nil {
		return nil, fmt.Errorf("idemotel: webhook instruments: %w", err)
	}
	if t.monitor, err = newMonitorInstruments(t.meter); err != nil {
		return nil, fmt.Errorf("idemotel: monitor instruments: %w", err)
	}
	return t, nil
}

// Bucket boundaries of the histograms (the SDK's defaults suit
// milliseconds, not seconds or message counts).
var (
	durationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	batchBuckets    = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}
)

// NewPrometheus returns a Telemetry whose metrics a Prometheus server
// scrapes from handler (mount it at /metrics): a registry of its own fed by
// OpenTelemetry's Prometheus exporter, under the names of
// docs/observability.md and the alert rules. cfg may be nil; its
// MeterProvider must be (NewPrometheus makes one); traces follow
// cfg.TracerProvider as with New.
func NewPrometheus(cfg *Config) (*Telemetry, http.Handler, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MeterProvider != nil {
		return nil, nil, fmt.Errorf("%w: NewPrometheus makes the MeterProvider: leave Config.MeterProvider nil", ErrInvalidConfig)
	}
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return nil, nil, fmt.Errorf("idemotel: prometheus exporter: %w", err)
	}
	c.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	t, err := New(&c)
	if err != nil {
		return nil, nil, err
	}
	return t, promhttp.HandlerFor(registry, promhttp.HandlerOpts{}), nil
}
