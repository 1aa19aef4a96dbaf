package idemotel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idemkit/outbox"
)

// outboxInstruments are the outbox relay's instruments.
type outboxInstruments struct {
	messages  metric.Int64Counter           // idemkit_outbox_messages_total
	latency   metric.Float64Histogram       // idemkit_outbox_publish_latency_seconds
	backlog   metric.Int64ObservableGauge   // idemkit_outbox_backlog_messages
	oldestAge metric.Float64ObservableGauge // idemkit_outbox_oldest_age_seconds
}

const keyTable = "table"

func newOutboxInstruments(m metric.Meter) (outboxInstruments, error) {
	var in outboxInstruments
	var errs [4]error
	in.messages, errs[0] = m.Int64Counter("idemkit.outbox.messages", metric.WithUnit("{message}"),
		metric.WithDescription("Relay outcomes: published, failed (an attempt, tried again), parked."))
	in.latency, errs[1] = m.Float64Histogram("idemkit.outbox.publish_latency", metric.WithUnit("s"),
		metric.WithDescription("Enqueue (by the database clock) to publish acknowledged and marked."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	in.backlog, errs[2] = m.Int64ObservableGauge("idemkit.outbox.backlog_messages", metric.WithUnit("{message}"),
		metric.WithDescription("Messages not yet published and not parked, as of the relay's last Stats."))
	in.oldestAge, errs[3] = m.Float64ObservableGauge("idemkit.outbox.oldest_age", metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest unpublished message, as of the relay's last Stats."))
	return in, errors.Join(errs[:]...)
}

// Relay observes an outbox relay; Close stops its gauges.
type Relay struct {
	reg metric.Registration
}

// Relay wires the telemetry into cfg before outbox.NewRelay(pool, store,
// cfg): it adds an observer to cfg.Observers so that published, failed and
// parked records count into
// idemkit_outbox_messages_total, each published record's enqueue→publish
// time into idemkit_outbox_publish_latency_seconds, and the relay's Stats
// (every cfg.StatsInterval) feed idemkit_outbox_backlog_messages and
// idemkit_outbox_oldest_age_seconds, labelled with the store's table
// (store.Name(): schema.table).
func (t *Telemetry) Relay(store *outbox.Store, cfg *outbox.RelayConfig) (*Relay, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil relay config", ErrInvalidConfig)
	}
	if store == nil {
		return nil, fmt.Errorf("%w: nil outbox store", ErrInvalidConfig)
	}
	table := store.Name()
	in := &t.outbox
	ctx := context.Background()
	published := attrs(keyTable, table, keyOutcome, "published")
	failed := attrs(keyTable, table, keyOutcome, "failed")
	parked := attrs(keyTable, table, keyOutcome, "parked")
	own := attrs(keyTable, table)
	// Counters start at 0, so that increase() sees the first event.
	for _, o := range []attrOpts{published, failed, parked} {
		in.messages.Add(ctx, 0, o.add...)
	}
	ro := &relayObserver{in: in, published: published, failed: failed, parked: parked, own: own}
	// A new slice, so that one shared with another config is not written
	// into.
	cfg.Observers = append(slices.Clip(cfg.Observers), ro)
	reg, err := t.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		ro.mu.Lock()
		st := ro.last
		ro.mu.Unlock()
		if st != nil {
			o.ObserveInt64(in.backlog, st.Backlog, own.obs...)
			o.ObserveFloat64(in.oldestAge, st.OldestAge.Seconds(), own.obs...)
		}
		return nil
	}, in.backlog, in.oldestAge)
	if err != nil {
		return nil, fmt.Errorf("idemotel: relay gauges: %w", err)
	}
	return &Relay{reg: reg}, nil
}

// Close unregisters the relay's gauges.
func (r *Relay) Close() error { return r.reg.Unregister() }

// relayObserver is the relay's observer: counters per event, the last
// Stats for the gauges.
type relayObserver struct {
	in                             *outboxInstruments
	published, failed, parked, own attrOpts
	mu                             sync.Mutex
	last                           *outbox.Stats
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
	if e.Parked {
		o.in.messages.Add(ctx, 1, o.parked.add...)
	} else {
		o.in.messages.Add(ctx, 1, o.failed.add...)
	}
}

func (o *relayObserver) Stats(_ context.Context, st *outbox.Stats) {
	c := *st
	o.mu.Lock()
	o.last = &c
	o.mu.Unlock()
}
