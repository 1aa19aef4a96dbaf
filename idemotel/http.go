package idemotel

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idemkit/idemhttp"
)

// Span attributes of an idempotent HTTP request.
const (
	AttrAccount        = attribute.Key("idemkit.account")
	AttrOperation      = attribute.Key("idemkit.operation")
	AttrIdempotencyKey = attribute.Key("idemkit.idempotency_key")
	AttrHTTPOutcome    = attribute.Key("idemkit.http.outcome")
	AttrHTTPStatus     = attribute.Key("http.response.status_code")
)

// httpInstruments are package idemhttp's instruments.
type httpInstruments struct {
	requests metric.Int64Counter         // idemkit_http_requests_total
	duration metric.Float64Histogram     // idemkit_http_request_duration_seconds
	stuck    metric.Int64ObservableGauge // idemkit_http_stuck_records
}

const keyOperation = "operation"

func newHTTPInstruments(m metric.Meter) (httpInstruments, error) {
	var in httpInstruments
	var errs [3]error
	in.requests, errs[0] = m.Int64Counter("idemkit.http.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Idempotency-Key requests by outcome: first, replay, in_flight, mismatch, released, lease_lost, settled, invalid, unavailable, no_key."))
	in.duration, errs[1] = m.Float64Histogram("idemkit.http.request.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a request through the middleware, by outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	in.stuck, errs[2] = m.Int64ObservableGauge("idemkit.http.stuck_records", metric.WithUnit("{record}"),
		metric.WithDescription("Idempotency records in flight past their lease."))
	return in, errors.Join(errs[:]...)
}

// HTTP wires the telemetry into cfg before idemhttp.New: it chains
// cfg.Observe so that each request counts into idemkit_http_requests_total
// and idemkit_http_request_duration_seconds (by operation and outcome: the
// operation label is cfg.Operation's value, with idemhttp.OperationDefault
// at most ten methods per registered ServeMux pattern, or ten in all
// without patterns, whatever clients send) and
// sets the account, operation, idempotency key, outcome and status on the
// request's span. It returns the middleware to put in front of the
// idempotency middleware: it continues the trace context of the request's
// headers and starts that span (kind server), so that the handler's work,
// and outbox messages it enqueues (see Outbox), belong to it.
func (t *Telemetry) HTTP(cfg *idemhttp.Config) (func(http.Handler) http.Handler, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil idemhttp config", ErrInvalidConfig)
	}
	var mu sync.Mutex
	opts := map[[2]string]attrOpts{}
	prev := cfg.Observe
	cfg.Observe = func(ctx context.Context, e idemhttp.Event) {
		k := [2]string{e.Operation, string(e.Outcome)}
		mu.Lock()
		o, ok := opts[k]
		if !ok {
			o = attrs(keyOperation, e.Operation, keyOutcome, string(e.Outcome))
			opts[k] = o
		}
		mu.Unlock()
		t.http.requests.Add(ctx, 1, o.add...)
		t.http.duration.Record(ctx, e.Duration.Seconds(), o.rec...)
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.SetAttributes(AttrAccount.String(e.Account), AttrOperation.String(e.Operation),
				AttrIdempotencyKey.String(e.Key), AttrHTTPOutcome.String(string(e.Outcome)), AttrHTTPStatus.Int(e.Status))
			if e.Status >= 500 {
				span.SetStatus(codes.Error, string(e.Outcome))
			}
		}
		if prev != nil {
			prev(ctx, e)
		}
	}
	return func(next http.Handler) http.Handler {
		if t.noTraces {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
			ctx, span := t.tracer.Start(ctx, r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer),
				trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
			defer span.End()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}, nil
}
