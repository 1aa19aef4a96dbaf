// Package testobs is the tests' consumer observer: one optional function
// per event, in the shape a test wants.
package testobs

import (
	"context"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/outbox"
	"github.com/idemkit/idemkit/retry"
)

// Hooks is a test's consumer observer: one optional function per event,
// registered with Of.
type Hooks struct {
	OnTxStart            func(ctx context.Context, msgs []*consumer.Message, attempt int) context.Context
	OnTxEnd              func(ctx context.Context, msgs []*consumer.Message, outcomes []consumer.Outcome, err error, d time.Duration)
	OnAfterCommit        func(ctx context.Context, msgs []*consumer.Message) // at TxEnd of a committed transaction
	OnLockWait           func(d time.Duration)                               // at TxEnd, when its claims waited for a lock
	OnOutcome            func(ctx context.Context, msg *consumer.Message, outcome consumer.Outcome)
	OnBeyondHorizon      func(ctx context.Context, msg *consumer.Message, err *consumer.HorizonError, applied bool)
	OnRetry              func(ctx context.Context, msg *consumer.Message, attempt int, err error, class retry.Class, delay time.Duration)
	OnOffsetCommitted    func(topic string, partition int, next int64)
	OnOffsetCommitFailed func(topic string, offsets map[int]int64, err error)
	OnPurged             func(deleted int64)
	OnRebalanced         func(generation int32, partitions []int)
	OnAssigned           func(topic string, partition int, start int64)
	OnPositionMoved      func(err *consumer.PositionError)
	OnHeld               func(topic string, partition int, lastStable, highWatermark int64, held time.Duration)
	OnOutageStarted      func(op string, err error)
	OnOutageEnded        func(op string, d time.Duration)
}

// Of returns the Hooks registered in cfg.Observers, registering new ones
// when there are none.
func Of(cfg *consumer.Config) *Hooks {
	for _, o := range cfg.Observers {
		if h, ok := o.(*Hooks); ok {
			return h
		}
	}
	h := &Hooks{}
	cfg.Observers = append(cfg.Observers, h)
	return h
}

func (h *Hooks) TxStart(ctx context.Context, e *consumer.TxStartEvent) context.Context {
	if h.OnTxStart == nil {
		return ctx
	}
	return h.OnTxStart(ctx, e.Messages, e.Attempt)
}

func (h *Hooks) TxEnd(ctx context.Context, e *consumer.TxEndEvent) {
	if h.OnTxEnd != nil {
		h.OnTxEnd(ctx, e.Messages, e.Outcomes, e.Err, e.Duration)
	}
	if h.OnAfterCommit != nil && e.Err == nil {
		h.OnAfterCommit(ctx, e.Messages)
	}
	if h.OnLockWait != nil && e.LockWait > 0 {
		h.OnLockWait(e.LockWait)
	}
}

func (h *Hooks) Outcome(ctx context.Context, e *consumer.OutcomeEvent) {
	if h.OnBeyondHorizon != nil && e.Horizon != nil {
		h.OnBeyondHorizon(ctx, e.Message, e.Horizon, e.Outcome == consumer.Applied)
	}
	if h.OnOutcome != nil {
		h.OnOutcome(ctx, e.Message, e.Outcome)
	}
}

func (h *Hooks) Retry(ctx context.Context, e *consumer.RetryEvent) {
	if h.OnRetry != nil {
		h.OnRetry(ctx, e.Message, e.Attempt, e.Err, e.Class, e.Delay)
	}
}

func (h *Hooks) OffsetCommit(_ context.Context, e *consumer.OffsetCommitEvent) {
	switch {
	case e.Err != nil && h.OnOffsetCommitFailed != nil:
		h.OnOffsetCommitFailed(e.Topic, e.Offsets, e.Err)
	case e.Err == nil && h.OnOffsetCommitted != nil:
		for p, next := range e.Offsets {
			h.OnOffsetCommitted(e.Topic, p, next)
		}
	}
}

func (h *Hooks) Purged(_ context.Context, e *consumer.PurgeEvent) {
	if h.OnPurged != nil {
		h.OnPurged(e.Deleted)
	}
}

func (h *Hooks) Rebalanced(_ context.Context, e *consumer.RebalanceEvent) {
	if h.OnRebalanced != nil {
		h.OnRebalanced(e.Generation, e.Partitions)
	}
}

func (h *Hooks) Assigned(_ context.Context, e *consumer.AssignEvent) {
	if h.OnAssigned != nil {
		h.OnAssigned(e.Topic, e.Partition, e.Start)
	}
}

func (h *Hooks) PositionMoved(_ context.Context, e *consumer.PositionError) {
	if h.OnPositionMoved != nil {
		h.OnPositionMoved(e)
	}
}

func (h *Hooks) Held(_ context.Context, e *consumer.HeldEvent) {
	if h.OnHeld != nil {
		h.OnHeld(e.Topic, e.Partition, e.LastStable, e.HighWatermark, e.Held)
	}
}

func (h *Hooks) OutageStarted(_ context.Context, e *consumer.OutageEvent) {
	if h.OnOutageStarted != nil {
		h.OnOutageStarted(e.Op, e.Err)
	}
}

func (h *Hooks) OutageEnded(_ context.Context, e *consumer.OutageEvent) {
	if h.OnOutageEnded != nil {
		h.OnOutageEnded(e.Op, e.Duration)
	}
}

// Outbox is a test's outbox observer: one optional function per event,
// registered with OutboxOf or listed in a config's Observers.
type Outbox struct {
	OnAfterPublish func(ctx context.Context, recs []outbox.Record) // delivered, marks not committed yet
	OnPublished    func(recs []outbox.Record)
	OnFailed       func(rec outbox.Record, err error) // to be tried again
	OnDead         func(rec outbox.Record, err error)
	OnStats        func(st outbox.Stats)
}

// OutboxOf returns the Outbox observer in *observers, registering a new one
// when there is none.
func OutboxOf(observers *[]outbox.Observer) *Outbox {
	for _, o := range *observers {
		if h, ok := o.(*Outbox); ok {
			return h
		}
	}
	h := &Outbox{}
	*observers = append(*observers, h)
	return h
}

func (h *Outbox) Delivered(ctx context.Context, e *outbox.DeliveryEvent) {
	if h.OnAfterPublish != nil {
		h.OnAfterPublish(ctx, e.Records)
	}
}

func (h *Outbox) Published(_ context.Context, e *outbox.PublishEvent) {
	if h.OnPublished != nil {
		h.OnPublished(e.Records)
	}
}

func (h *Outbox) Failed(_ context.Context, e *outbox.FailureEvent) {
	switch {
	case e.Dead && h.OnDead != nil:
		h.OnDead(e.Record, e.Err)
	case !e.Dead && h.OnFailed != nil:
		h.OnFailed(e.Record, e.Err)
	}
}

func (h *Outbox) Stats(_ context.Context, st *outbox.Stats) {
	if h.OnStats != nil {
		h.OnStats(*st)
	}
}
