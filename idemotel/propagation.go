package idemotel

import (
	"context"
	"errors"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/idemkit/idemkit/outbox"
)

// HeaderCarrier adapts Kafka headers to propagation.TextMapCarrier, for use
// with any propagator: prop.Inject(ctx, (*HeaderCarrier)(&msg.Headers)).
// Keys are compared exactly, as Kafka headers are case-sensitive; the W3C
// propagators use lower-case names.
type HeaderCarrier []kafka.Header

var _ propagation.TextMapCarrier = (*HeaderCarrier)(nil)

// Get returns the value of the first header named key, or "".
func (c *HeaderCarrier) Get(key string) string {
	for _, h := range *c {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set replaces the headers named key by one with value.
func (c *HeaderCarrier) Set(key, value string) {
	hs := (*c)[:0:0]
	for _, h := range *c {
		if h.Key != key {
			hs = append(hs, h)
		}
	}
	*c = append(hs, kafka.Header{Key: key, Value: []byte(value)})
}

// Keys returns the header names.
func (c *HeaderCarrier) Keys() []string {
	keys := make([]string, len(*c))
	for i, h := range *c {
		keys[i] = h.Key
	}
	return keys
}

// Inject writes the trace context and baggage of ctx into headers (the
// Telemetry's propagator; W3C "traceparent", "tracestate" and "baggage" by
// default), replacing headers of those names, so that the consumer of the
// message continues the trace: call it on a kafka.Message's Headers before
// producing it, or on an outbox.Message's before enqueueing it. Headers are
// copied, never changed in place: a slice shared with another message is
// safe. Without a span or baggage in ctx it changes nothing.
func (t *Telemetry) Inject(ctx context.Context, headers *[]kafka.Header) {
	t.prop.Inject(ctx, (*HeaderCarrier)(headers))
}

// Extract returns ctx with the trace context and baggage that headers carry
// (a remote span context: a span started from the result is its child).
func (t *Telemetry) Extract(ctx context.Context, headers []kafka.Header) context.Context {
	return t.prop.Extract(ctx, (*HeaderCarrier)(&headers))
}

// Outbox makes the outbox stamp the trace context (and baggage) of each
// EnqueueTx's context on the messages it enqueues (cfg.ContextHeaders,
// chained after one already set): the relay publishes them, and a consumer
// instrumented by Consumer continues the trace. It does nothing with the
// no-op tracer provider.
func (t *Telemetry) Outbox(cfg *outbox.Config) error {
	if cfg == nil {
		return errors.New("idemotel: nil outbox config")
	}
	if t.noTraces {
		return nil
	}
	prev := cfg.ContextHeaders
	cfg.ContextHeaders = func(ctx context.Context) []kafka.Header {
		var hs []kafka.Header
		if prev != nil {
			hs = prev(ctx)
		}
		t.Inject(ctx, &hs)
		return hs
	}
	return nil
}
