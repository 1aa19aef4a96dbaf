package idemotel

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemkit/idemkit/webhook"
)

// Span attributes of a webhook delivery.
const (
	AttrWebhookProvider = attribute.Key("idemkit.webhook.provider")
	AttrWebhookOutcome  = attribute.Key("idemkit.webhook.outcome")
)

// webhookInstruments are package webhook's instruments.
type webhookInstruments struct {
	deliveries metric.Int64Counter     // idemkit_webhook_deliveries_total
	duration   metric.Float64Histogram // idemkit_webhook_delivery_duration_seconds
}

const keyProvider = "provider"

// webhookOutcomes are the outcomes whose counters start at zero.
var webhookOutcomes = []webhook.Outcome{webhook.OutcomeProcessed, webhook.OutcomeDuplicate, webhook.OutcomeFailed,
	webhook.OutcomeRetry, webhook.OutcomeInFlight, webhook.OutcomeKeyReused, webhook.OutcomeBadSignature,
	webhook.OutcomeBadTimestamp, webhook.OutcomeInvalid, webhook.OutcomeUnavailable}

func newWebhookInstruments(m metric.Meter) (webhookInstruments, error) {
	var in webhookInstruments
	var errs [2]error
	in.deliveries, errs[0] = m.Int64Counter("idemkit.webhook.deliveries", metric.WithUnit("{delivery}"),
		metric.WithDescription("Webhook deliveries by provider and outcome: processed, duplicate, failed, retry, in_flight, key_reused, bad_signature, bad_timestamp, invalid, unavailable."))
	in.duration, errs[1] = m.Float64Histogram("idemkit.webhook.delivery.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of a webhook delivery from its arrival to its answer, by provider and outcome."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	return in, errors.Join(errs[:]...)
}

// Webhook wires the telemetry into cfg before webhook.New: it chains
// cfg.Observe so that each delivery counts into
// idemkit_webhook_deliveries_total and
// idemkit_webhook_delivery_duration_seconds by provider and outcome (the
// counters of cfg.Provider start at zero), and sets the provider and the
// outcome on the request's span (the one HTTP's middleware starts: call
// HTTP(&cfg.HTTP) too for the idemkit_http_ metrics and that span).
func (t *Telemetry) Webhook(cfg *webhook.Config) error {
	if cfg == nil {
		return fmt.Errorf("%w: nil webhook config", ErrInvalidConfig)
	}
	var mu sync.Mutex
	opts := map[[2]string]attrOpts{}
	get := func(provider string, outcome webhook.Outcome) attrOpts {
		k := [2]string{provider, string(outcome)}
		mu.Lock()
		defer mu.Unlock()
		o, ok := opts[k]
		if !ok {
			o = attrs(keyProvider, provider, keyOutcome, string(outcome))
			opts[k] = o
		}
		return o
	}
	if cfg.Provider != "" {
		for _, o := range webhookOutcomes {
			t.webhook.deliveries.Add(context.Background(), 0, get(cfg.Provider, o).add...)
		}
	}
	prev := cfg.Observe
	cfg.Observe = func(ctx context.Context, e webhook.Event) {
		o := get(e.Provider, e.Outcome)
		t.webhook.deliveries.Add(ctx, 1, o.add...)
		t.webhook.duration.Record(ctx, e.Duration.Seconds(), o.rec...)
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			span.SetAttributes(AttrWebhookProvider.String(e.Provider), AttrWebhookOutcome.String(string(e.Outcome)))
		}
		if prev != nil {
			prev(ctx, e)
		}
	}
	return nil
}
