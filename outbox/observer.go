package outbox

import (
	"context"
	"fmt"

	"github.com/idemkit/idemkit/internal/observe"
)

// An Observer watches a Relay or a Dispatcher: metrics, tracing, tests. It
// is any value that implements one or more of DeliveryObserver,
// PublishObserver, FailureObserver and StatsObserver; RelayConfig.Observers
// and DispatcherConfig.Observers list them, and NewRelay and NewDispatcher
// refuse a value that implements none. Each event goes to every observer
// that implements its interface, in the order of the list. Observers run
// synchronously on the delivery goroutine (Stats on its own): keep them
// fast. An event's struct is valid during the call only.
type Observer any

// DeliveryObserver observes records delivered (acknowledged by every
// in-sync replica, or handled) before their marks are committed in the
// database: a crash there delivers them again later, with the same IDs.
type DeliveryObserver interface {
	Delivered(ctx context.Context, e *DeliveryEvent)
}

// DeliveryEvent is a round's delivered records.
type DeliveryEvent struct{ Records []Record }

// PublishObserver observes records whose delivery is marked and committed
// (handled, for a Dispatcher).
type PublishObserver interface {
	Published(ctx context.Context, e *PublishEvent)
}

// PublishEvent is a round's published records.
type PublishEvent struct{ Records []Record }

// FailureObserver observes failed deliveries, once the failure is
// recorded.
type FailureObserver interface {
	Failed(ctx context.Context, e *FailureEvent)
}

// FailureEvent is a record whose delivery failed.
type FailureEvent struct {
	Record Record
	Err    error
	// Dead is true when the record failed for good and is dead (its key's
	// later records wait behind it until Store.Retry requeues it); false
	// when it will be tried again.
	Dead bool
}

// StatsObserver observes the outbox's backlog, every StatsInterval.
type StatsObserver interface {
	Stats(ctx context.Context, e *Stats)
}

// observers are a config's Observers sorted by the events they take.
type observers struct {
	delivery []DeliveryObserver
	publish  []PublishObserver
	failure  []FailureObserver
	stats    []StatsObserver
}

// newObservers sorts list; a value that takes no event is an error.
func newObservers(list []Observer) (observers, error) {
	var o observers
	for i, v := range list {
		n := observe.Take(v, &o.delivery) + observe.Take(v, &o.publish) + observe.Take(v, &o.failure) + observe.Take(v, &o.stats)
		if n == 0 {
			return o, fmt.Errorf("%w: Observers[%d] (%T) implements no observer interface", ErrInvalidConfig, i, v)
		}
	}
	return o, nil
}

func (o *observers) delivered(ctx context.Context, recs []Record) {
	if len(recs) == 0 || len(o.delivery) == 0 {
		return
	}
	e := &DeliveryEvent{Records: recs}
	for _, x := range o.delivery {
		x.Delivered(ctx, e)
	}
}

func (o *observers) published(ctx context.Context, recs []Record) {
	if len(recs) == 0 || len(o.publish) == 0 {
		return
	}
	e := &PublishEvent{Records: recs}
	for _, x := range o.publish {
		x.Published(ctx, e)
	}
}

func (o *observers) failed(ctx context.Context, rec Record, err error, dead bool) {
	if len(o.failure) == 0 {
		return
	}
	e := &FailureEvent{Record: rec, Err: err, Dead: dead}
	for _, x := range o.failure {
		x.Failed(ctx, e)
	}
}

func (o *observers) statsOf(ctx context.Context, st Stats) {
	for _, x := range o.stats {
		x.Stats(ctx, &st)
	}
}
