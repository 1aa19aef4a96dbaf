package consumer

import (
	"context"
	"fmt"
	"time"

	"github.com/idemkit/idemkit/internal/observe"
	"github.com/idemkit/idemkit/retry"
)

// An Observer watches a Runner: metrics, tracing, logs, tests. It is any
// value that implements one or more of the event interfaces below
// (TxObserver, OutcomeObserver, RetryObserver, RebalanceObserver,
// AssignObserver, PositionObserver, HeldObserver, OffsetObserver,
// PurgeObserver, OutageObserver); Config.Observers lists them, and New
// refuses a value that implements none. Each event goes to every observer
// that implements its interface, in the order of the list (TxEnd in the
// reverse order, as deferred calls unwind), so that several observers
// coexist without knowing of each other.
//
// Observers run synchronously on the goroutine of the event (the
// partition's, the committer's for offset commits): keep them fast, and do
// not panic in them (unlike a handler's or a middleware's, an observer's
// panic is not recovered). An event's struct is valid during the call only:
// copy what you keep. The context an observer gets is the transaction's
// (see TxObserver) where there is one.
type Observer any

// TxObserver observes transactions: one message, or a batch of one
// partition in offset order.
type TxObserver interface {
	// TxStart runs before the transaction begins. The context it returns
	// is the one the claim, the handlers, the other events of this
	// transaction and its TxEnd get: a tracer starts a span here. It must
	// derive from ctx (or cancellation, a rebalance or a shutdown, no
	// longer reaches the transaction); returning nil keeps ctx.
	TxStart(ctx context.Context, e *TxStartEvent) context.Context
	// TxEnd runs once per TxStart, when the transaction committed or was
	// rolled back. A rolled-back transaction may run again: another
	// TxStart follows.
	TxEnd(ctx context.Context, e *TxEndEvent)
}

// TxStartEvent is a transaction about to begin.
type TxStartEvent struct {
	Messages []*Message
	// Attempt counts the handler attempts of these messages, from 1: a
	// message retried in place starts transactions with attempt 2, 3, ….
	Attempt int
}

// TxEndEvent is a transaction that ended.
type TxEndEvent struct {
	Messages []*Message
	Attempt  int
	// Outcomes[i] is Messages[i]'s (Applied, Duplicate or Parked) when the
	// transaction committed; nil when it rolled back.
	Outcomes []Outcome
	// Err is nil when the transaction committed, else why it rolled back.
	Err error
	// Duration is from TxStart to the end of the commit or rollback.
	Duration time.Duration
	// LockWait is how long the transaction's claims waited for a lock
	// another session held (a concurrent claim of the same ID, or an
	// orphaned transaction holding the partition's position row), when
	// they waited long enough for the runner to log who held it (5s); 0
	// otherwise.
	LockWait time.Duration
}

// OutcomeObserver observes the fate of each message, once it is known.
type OutcomeObserver interface {
	Outcome(ctx context.Context, e *OutcomeEvent)
}

// OutcomeEvent is a message's fate.
type OutcomeEvent struct {
	Message *Message
	Outcome Outcome
	// Err is the *MessageError of a Failed message.
	Err error
	// Horizon is set for a message found beyond the dedup horizon (see
	// ErrBeyondHorizon): Applied anyway (HorizonApply) or Failed
	// (HorizonFail).
	Horizon *HorizonError
}

// RetryObserver observes handler failures retried in place.
type RetryObserver interface {
	// Retry runs with the failed transaction's context (its TxStart's,
	// ended): the runner's own logs about the failure are written with it
	// too, so that a log handler that reads it can add the trace ID.
	Retry(ctx context.Context, e *RetryEvent)
}

// RetryEvent is a handler failure about to be retried in place.
type RetryEvent struct {
	Message *Message
	// Attempt is the attempt that failed, from 1.
	Attempt int
	Err     error
	Class   retry.Class
	// Delay is the wait before the next attempt.
	Delay time.Duration
}

// RebalanceObserver observes the group's generations.
type RebalanceObserver interface {
	// Rebalanced runs when the group assigned this runner its partitions of
	// a new generation, before Assigned runs for each.
	Rebalanced(ctx context.Context, e *RebalanceEvent)
}

// RebalanceEvent is a new generation of the group.
type RebalanceEvent struct {
	Generation int32
	// Partitions are this runner's; it may have none.
	Partitions []int
}

// AssignObserver observes partitions as their work starts.
type AssignObserver interface {
	Assigned(ctx context.Context, e *AssignEvent)
}

// AssignEvent is a partition assigned to the runner.
type AssignEvent struct {
	Topic     string
	Partition int
	// Start is the offset the partition starts at: the later of Kafka's
	// committed offset and the PostgreSQL position, or kafka.FirstOffset /
	// kafka.LastOffset (Config.StartOffset) when neither has one.
	Start int64
}

// PositionObserver observes partitions that do not start at their stored
// position.
type PositionObserver interface {
	// PositionMoved gets a *PositionError matching ErrMessagesLost (Kafka
	// deleted messages before they were processed; the partition continues
	// at the log start) or ErrTopicRecreated (with RecreatedRestart: the
	// partition starts over at the log start of the new topic).
	PositionMoved(ctx context.Context, e *PositionError)
}

// HeldObserver observes partitions held back by a producer's open
// transaction.
type HeldObserver interface {
	// Held runs when a partition has been held for Config.HeldWarnAfter at
	// the last stable offset: records after it wait until the transaction
	// commits or aborts.
	Held(ctx context.Context, e *HeldEvent)
}

// HeldEvent is a partition held at its last stable offset.
type HeldEvent struct {
	Topic                     string
	Partition                 int
	LastStable, HighWatermark int64
	Held                      time.Duration
}

// OffsetObserver observes Kafka offset commits.
type OffsetObserver interface {
	OffsetCommit(ctx context.Context, e *OffsetCommitEvent)
}

// OffsetCommitEvent is a Kafka offset commit. When it failed because the
// group coordinator could not write it for now (coordinator not available,
// load in progress, a timeout, not enough replicas), the offsets go again
// with the next commit and the generation goes on; after any other failure
// the runner leaves the generation and the group forms again. Either way
// the PostgreSQL positions are what the runner resumes from, so nothing is
// lost or re-applied.
type OffsetCommitEvent struct {
	Topic string
	// Offsets are the next offsets to read, per partition.
	Offsets map[int]int64
	// Err is nil when the commit succeeded.
	Err error
}

// PurgeObserver observes the runner's retention purges (Config.Retention).
type PurgeObserver interface {
	Purged(ctx context.Context, e *PurgeEvent)
}

// PurgeEvent is a retention purge that completed.
type PurgeEvent struct {
	Deleted  int64
	Duration time.Duration
}

// OutageObserver observes outages the runner waits out. Each OutageStarted
// is followed by one OutageEnded: when the server answers again, or when no
// loop of the runner waits for it any more (Run ended, or a rebalance ended
// the partition workers that waited).
type OutageObserver interface {
	OutageStarted(ctx context.Context, e *OutageEvent)
	OutageEnded(ctx context.Context, e *OutageEvent)
}

// OutageEvent is an outage: Op names the server and what could not reach
// it ("postgres …" or "kafka …": "postgres partition N" for a partition's
// transactions, "kafka fetch partition N" for its reads).
type OutageEvent struct {
	Op string
	// Err is the error that started the outage (OutageStarted).
	Err error
	// Duration is how long it lasted (OutageEnded).
	Duration time.Duration
}

// observers are Config.Observers sorted by the events they take.
type observers struct {
	tx        []TxObserver
	outcome   []OutcomeObserver
	retry     []RetryObserver
	rebalance []RebalanceObserver
	assign    []AssignObserver
	position  []PositionObserver
	held      []HeldObserver
	offset    []OffsetObserver
	purge     []PurgeObserver
	outage    []OutageObserver
}

// newObservers sorts list; a value that takes no event is an error.
func newObservers(list []Observer) (observers, error) {
	var o observers
	for i, v := range list {
		n := observe.Take(v, &o.tx) + observe.Take(v, &o.outcome) + observe.Take(v, &o.retry) +
			observe.Take(v, &o.rebalance) + observe.Take(v, &o.assign) + observe.Take(v, &o.position) +
			observe.Take(v, &o.held) + observe.Take(v, &o.offset) + observe.Take(v, &o.purge) + observe.Take(v, &o.outage)
		if n == 0 {
			return o, fmt.Errorf("%w: Observers[%d] (%T) implements no observer interface", ErrInvalidConfig, i, v)
		}
	}
	return o, nil
}

func (o *observers) outcomeOf(ctx context.Context, e *OutcomeEvent) {
	for _, x := range o.outcome {
		x.Outcome(ctx, e)
	}
}

func (o *observers) retried(ctx context.Context, e *RetryEvent) {
	for _, x := range o.retry {
		x.Retry(ctx, e)
	}
}

func (o *observers) rebalanced(ctx context.Context, e *RebalanceEvent) {
	for _, x := range o.rebalance {
		x.Rebalanced(ctx, e)
	}
}

func (o *observers) assigned(ctx context.Context, e *AssignEvent) {
	for _, x := range o.assign {
		x.Assigned(ctx, e)
	}
}

func (o *observers) positionMoved(ctx context.Context, e *PositionError) {
	for _, x := range o.position {
		x.PositionMoved(ctx, e)
	}
}

func (o *observers) heldBack(ctx context.Context, e *HeldEvent) {
	for _, x := range o.held {
		x.Held(ctx, e)
	}
}

func (o *observers) offsetCommit(ctx context.Context, e *OffsetCommitEvent) {
	for _, x := range o.offset {
		x.OffsetCommit(ctx, e)
	}
}

func (o *observers) purged(ctx context.Context, e *PurgeEvent) {
	for _, x := range o.purge {
		x.Purged(ctx, e)
	}
}

func (o *observers) outageStarted(op string, err error) {
	e := &OutageEvent{Op: op, Err: err}
	for _, x := range o.outage {
		x.OutageStarted(context.Background(), e)
	}
}

func (o *observers) outageEnded(op string, d time.Duration) {
	e := &OutageEvent{Op: op, Duration: d}
	for _, x := range o.outage {
		x.OutageEnded(context.Background(), e)
	}
}
