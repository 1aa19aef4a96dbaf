package idemotel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idemkit/outbox"
)

// outboxInstruments are the outbox relay's instruments.
type outboxInstruments struct {
	messages  metric.Int64Counter           // idemkit_outbox_messages_total
	latency   metric.Float64Histogram       // idemkit_outbox_publish_latency_seconds
	backlog   metric.Int64ObservableGauge   // idemkit_outbox_backlog_messages (Monitor)
	oldestAge metric.Float64ObservableGauge // idemkit_outbox_oldest_age_seconds (Monitor)
	dead      metric.Int64ObservableGauge   // idemkit_outbox_dead_messages (Monitor)
	held      metric.Int64ObservableGauge   // idemkit_outbox_held_messages (Monitor)
}

const keyTable = "table"

func newOutboxInstruments(m metric.Meter) (outboxInstruments, error) {
	var in outboxInstruments
	var errs [6]error
	in.messages, errs[0] = m.Int64Counter("idemkit.outbox.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Relay outcomes: published, failed (an attempt, tried again), dead (failed for good)."))
	in.latency, errs[1] = m.Float64Histogram("idemkit.outbox.publish_latency", metric.WithUnit("s"),
		metric.WithDescription("Enqueue (by the database clock) to publish acknowledged and marked."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	in.backlog, errs[2] = m.Int64ObservableGauge("idemkit.outbox.backlog_messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages not yet published and not dead, from the table."))
	in.oldestAge, errs[3] = m.Float64ObservableGauge("idemkit.outbox.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest message not yet published and not dead, from the table; 0 when none."))
	in.dead, errs[4] = m.Int64ObservableGauge("idemkit.outbox.dead_messages", metric.WithUnit("{message}"),
		metric.WithDescription("Dead messages: failed for good, or held behind one of their key; from the table."))
	in.held, errs[5] = m.Int64ObservableGauge("idemkit.outbox.held_messages", metric.WithUnit("{message}"),
		metric.WithDescription("Of the dead messages, those held behind an earlier message of their key."))
	return in, errors.Join(errs[:]...)
}

// Relay wires the telemetry into cfg before outbox.NewRelay(pool, store,
// cfg): it adds an observer to cfg.Observers so that published, failed and
// dead records count into idemkit_outbox_messages_total, and each
// published record's enqueue→publish time into
// idemkit_outbox_publish_latency_seconds, labelled with the store's table
// (store.Name(): schema.table). The backlog and dead gauges come from
// the table, through a Monitor (Telemetry.Monitor): they hold when no
// relay runs.
func (t *Telemetry) Relay(store *outbox.Store, cfg *outbox.RelayConfig) error {
	if cfg == nil {
		return fmt.Errorf("%w: nil relay config", ErrInvalidConfig)
	}
	if store == nil {
		return fmt.Errorf("%w: nil outbox store", ErrInvalidConfig)
	}
	table := store.Name()
	in := &t.outbox
	ctx := context.Background()
	published := attrs(keyTable, table, keyOutcome, "published")
	failed := attrs(keyTable, table, keyOutcome, "failed")
	dead := attrs(keyTable, table, keyOutcome, "dead")
	own := attrs(keyTable, table)
	// Counters start at 0, so that increase() sees the first event.
	for _, o := range []attrOpts{published, failed, dead} {
		in.messages.Add(ctx, 0, o.add...)
	}
	ro := &relayObserver{in: in, published: published, failed: failed, dead: dead, own: own}
	// A new slice, so that one shared with another config is not written
	// into.
	cfg.Observers = append(slices.Clip(cfg.Observers), ro)
	return nil
}

// relayObserver is the relay's observer: counters per event.
type relayObserver struct {
	in                           *outboxInstruments
	published, failed, dead, own attrOpts
}

func (o *relayObserver) Published(ctx context.Context, e *outbox.PublishEvent) {
	now := time.Now()
	o.in.messages.Add(ctx, int64(len(e.Records)), o.published.add...)
	for _, r := range e.Records {
		if !r.EnqueuedAt.IsZero() {
			o.in.latency.Record(ctx, max(now.Sub(r.EnqueuedAt).Seconds(), 0), o.own.rec...)
		}
	}
}

func (o *relayObserver) Failed(ctx context.Context, e *outbox.FailureEvent) {
	if e.Dead {
		o.in.messages.Add(ctx, 1, o.dead.add...)
	} else {
		o.in.messages.Add(ctx, 1, o.failed.add...)
	}
}
