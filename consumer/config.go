package consumer

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/retry"
)

// Defaults of Config.
const (
	IDHeaderDefault                     = "message-id"
	BatchSizeDefault                    = 500
	BatchLingerDefault    time.Duration = 0
	MaxPartitionsDefault                = 16
	SessionTimeoutDefault               = 10 * time.Second
	// RebalanceTimeoutDefault is how long the group waits for its members to
	// rejoin during a rebalance (see Config.RebalanceTimeout).
	RebalanceTimeoutDefault = 5 * time.Second
	// HeartbeatIntervalDefault is how often a member tells the group it is
	// alive, and so how soon it hears of a rebalance.
	HeartbeatIntervalDefault = time.Second
	// MaxBufferedBytesDefault bounds the messages fetched ahead of the
	// handler, over all partitions (see Config.MaxBufferedBytes).
	MaxBufferedBytesDefault = 8 << 20
	// MessageOverhead is what one buffered message costs in memory besides
	// its key, value and headers (the structures that hold it); it counts
	// against MaxBufferedBytes with them.
	MessageOverhead = 320
	// PartitionWatchIntervalDefault is how often the runner looks for
	// partitions added to its topic.
	PartitionWatchIntervalDefault = 5 * time.Second
	// HeldWarnAfterDefault is how long a partition waits behind an open
	// transaction before the runner reports it.
	HeldWarnAfterDefault = 30 * time.Second
	PurgeIntervalDefault = 10 * time.Minute
	// HandlerTimeoutDefault is the time a transaction's handler calls get
	// (see Config.HandlerTimeout).
	HandlerTimeoutDefault = 30 * time.Second
)

// offsetCommitInterval is the least time between two Kafka offset commits
// of a runner: positions committed meanwhile go in the next request, so
// Kafka's offsets (and lag tooling) trail PostgreSQL's by about that much,
// while the broker writes a few commits a second instead of one per
// transaction. The PostgreSQL position, written with the effects, is what
// the runner resumes from.
const offsetCommitInterval = 200 * time.Millisecond

// txRetries bounds how often a transaction that failed with a
// serialization failure or a deadlock is run again.
const txRetries = 10

// Handler applies one message's business effect inside tx. The runner owns tx:
// a handler must neither commit nor roll it back. Returning an error rolls
// back the effect together with the message's dedup claim.
type Handler interface {
	Handle(ctx context.Context, tx pgx.Tx, msg *Message) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, tx pgx.Tx, msg *Message) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, tx pgx.Tx, msg *Message) error {
	return f(ctx, tx, msg)
}

// BatchHandler applies the effects of several messages of one partition at
// once, so that they can be written with set-based SQL. It receives only the
// messages whose IDs were newly claimed in tx, in offset order.
type BatchHandler interface {
	HandleBatch(ctx context.Context, tx pgx.Tx, msgs []*Message) error
}

// BatchHandlerFunc adapts a function to BatchHandler.
type BatchHandlerFunc func(ctx context.Context, tx pgx.Tx, msgs []*Message) error

// HandleBatch calls f.
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, tx pgx.Tx, msgs []*Message) error {
	return f(ctx, tx, msgs)
}

// Middleware wraps a Handler: tracing, metrics or logging around each call,
// with the call's context (which carries the transaction's span when a
// TxObserver started one). It runs inside the transaction, after the claim.
type Middleware func(Handler) Handler

// BatchMiddleware wraps a BatchHandler, like Middleware.
type BatchMiddleware func(BatchHandler) BatchHandler

// MissingIDPolicy says what happens to a message that carries no usable ID.
type MissingIDPolicy int

const (
	// MissingIDFail treats the message as failed with ErrMissingID: it is not
	// retried and goes to Config.OnFailure (or stops the runner). This is the
	// default: a message is never processed without dedup.
	MissingIDFail MissingIDPolicy = iota
	// MissingIDUseCoordinates derives the ID "topic/partition/offset". Such an
	// ID deduplicates redeliveries of the same record, but not a producer that
	// sent the same event twice (two records, two offsets).
	MissingIDUseCoordinates
)

// HorizonPolicy says what happens to a message beyond the dedup horizon
// (see ErrBeyondHorizon and Config.Retention): its record timestamp is older
// than Retention minus HorizonMargin, and its claim came back new, which may
// mean it is new or that its record was purged.
type HorizonPolicy int

const (
	// HorizonFail treats the message as failed with a *HorizonError
	// (matching ErrBeyondHorizon): its claim and effects are rolled back, it
	// is not retried, and it goes to Config.OnFailure (or stops the runner).
	// This is the default: what dedup can no longer vouch for is never
	// applied silently.
	HorizonFail HorizonPolicy = iota
	// HorizonApply applies the message as new; its OutcomeEvent carries
	// the *HorizonError.
	HorizonApply
)

// HorizonMarginMax is the largest default of Config.HorizonMargin.
const HorizonMarginMax = 5 * time.Minute

// FailureFunc receives a message whose handler failed for good (a permanent
// error, or retries exhausted); err is a *MessageError with the message's
// failure history. Returning nil means the message was taken care of (for
// example written to a dead-letter topic, see package dlq): its position
// moves on. Returning an error stops the runner with that error; the
// position does not move, so nothing is lost.
type FailureFunc func(ctx context.Context, msg *Message, err error) error

// Config configures a Runner. Kafka.Brokers, Topic, GroupID and one of
// Handler or BatchHandler are required; the pool the transactions run on is
// New's first argument, as in every idemkit constructor.
type Config struct {
	// Kafka is how to reach the cluster: its brokers, TLS and SASL (see
	// package kafkaconn). The consumer group, the partition reads and the
	// metadata and offset requests all go through it. Brokers is required;
	// the rest defaults to plaintext without authentication.
	Kafka kafkaconn.Config
	// Topic is the topic to consume. It must exist: the runner never creates it.
	Topic string
	// GroupID is the Kafka consumer group.
	GroupID string
	// Name scopes the dedup records: two runners with the same Name share one
	// set of processed IDs. Defaults to GroupID.
	Name string

	// pool is where the handler's transaction runs: New's argument.
	pool *pgxpool.Pool
	// Store is the dedup store; its tables must be migrated (see package
	// migrate). Defaults to dedup.New(nil): schema "public", default tables.
	Store *dedup.Store

	// Handler handles one message per call. With BatchSize > 1 several calls
	// share one transaction.
	Handler Handler
	// BatchHandler handles all new messages of a batch in one call. Set
	// either Handler or BatchHandler.
	BatchHandler BatchHandler
	// Middleware wraps Handler; the first is the outermost. A middleware
	// that returns nil is a configuration error.
	Middleware []Middleware
	// BatchMiddleware wraps BatchHandler; the first is the outermost.
	BatchMiddleware []BatchMiddleware

	// IDHeader is the Kafka header that carries the message ID. Defaults to
	// "message-id".
	IDHeader string
	// IDFunc extracts the message ID; when set, IDHeader is not read. msg is
	// the record the handler receives later: IDFunc reads it and must not
	// modify it. IDFromJSON("event_id") takes it from a member of a JSON
	// value.
	IDFunc func(msg *kafka.Message) (string, error)
	// MissingID says what happens to a message with no usable ID. Defaults to
	// MissingIDFail.
	MissingID MissingIDPolicy

	// BatchSize is the most messages of one partition that share a
	// transaction. By default a partition's worker takes every message
	// already fetched, up to 500, into one transaction and never waits for
	// more (BatchLinger 0): under a trickle each message commits alone, as
	// fast as with one transaction per message; under load batches fill and
	// the claims of a batch go in one statement. A failing message is still
	// isolated and retried alone, hooks and outcomes stay per message, and
	// order per partition holds; a batch holds its rows' locks until it
	// commits (a deadlock with another writer runs the transaction again,
	// at most 10 runs in all). Set 1 for one transaction per message. Defaults to 500.
	BatchSize int
	// BatchLinger is how long a batch waits to fill once its first message
	// arrived. Defaults to 0: a batch takes what is already fetched and does
	// not wait.
	BatchLinger time.Duration
	// MaxPartitions bounds how many partitions are processed at once.
	// Defaults to 16.
	MaxPartitions int

	// HandlerTimeout bounds the handler calls of one transaction: their
	// context ends after it, and a handler still running then fails (its
	// error is retried as a transient one). It also bounds the transaction
	// on both ends, so that a connection that goes silent never holds a
	// partition for long: the runner gives the transaction up (and runs it
	// again on another connection) after HandlerTimeout plus 10s, and
	// PostgreSQL ends it after as long idle (SET LOCAL
	// idle_in_transaction_session_timeout, sent with BEGIN), releasing its
	// locks, should the runner vanish. Defaults to 30s.
	HandlerTimeout time.Duration

	// Retry decides whether and when a failed message is tried again, and
	// which errors are permanent. Defaults to the zero retry.Policy: 5
	// attempts, exponential from 100ms with jitter, retry.Classify.
	Retry retry.Policy
	// OnFailure receives messages that failed for good. Defaults to nil: the
	// runner stops and Run returns a *MessageError; nothing is skipped.
	OnFailure FailureFunc
	// FailureMode is Blocking (retry in place; the partition waits) or
	// NonBlocking (park the failing message and its key's later messages in
	// PostgreSQL; other keys flow). Defaults to Blocking.
	FailureMode FailureMode
	// ParkedRetry paces retries of parked messages (NonBlocking only).
	// Defaults to 10 attempts, 1s to 1m apart, with jitter.
	ParkedRetry retry.Policy
	// ParkedPoll is how often a partition with parked messages looks for
	// due ones (NonBlocking only). Defaults to 500ms.
	ParkedPoll time.Duration

	// Retention, when positive, makes Run purge dedup records older than it
	// every PurgeInterval (dedup.Store.PurgeConsumer, in bounded batches).
	// Only the records of this runner's Name are purged: other consumers
	// sharing the table keep theirs. After a record is purged, a redelivered
	// message with its ID counts as new: keep Retention longer than any
	// redelivery or replay you expect. Defaults to 0: Run purges nothing
	// (purge on your own schedule, or with `idemkit dedup purge`).
	Retention time.Duration
	// PurgeInterval is how often Run purges when Retention is set. Defaults
	// to 10m.
	PurgeInterval time.Duration
	// OnBeyondHorizon says what happens, when Retention is set, to a message
	// whose claim is new although its record timestamp is older than
	// Retention minus HorizonMargin (its record may have been purged: see
	// ErrBeyondHorizon). Unused without Retention. Defaults to HorizonFail.
	OnBeyondHorizon HorizonPolicy
	// HorizonMargin is how much younger than Retention a message must be for
	// its claim to be trusted: it covers the skew between the clocks of the
	// producers (or brokers, for LogAppendTime), of this process and of
	// PostgreSQL, whose now() the purge uses. Defaults to Retention/10, at
	// most HorizonMarginMax (5m); it must be less than Retention.
	HorizonMargin time.Duration

	// StartOffset is where a partition with no committed position starts:
	// kafka.FirstOffset or kafka.LastOffset. Defaults to kafka.FirstOffset.
	StartOffset int64
	// OnRecreated says what happens to a partition whose stored position
	// does not match the topic (deleted and created again, or data lost on
	// the broker; see ErrTopicRecreated). Defaults to RecreatedStop.
	OnRecreated RecreatedPolicy
	// MaxBufferedBytes bounds the bytes of messages (keys, values, headers,
	// and MessageOverhead each) fetched ahead of the handler, over all
	// assigned partitions: each
	// partition may buffer MaxBufferedBytes divided by the partitions
	// assigned, and always at least one message; fetches are sized by what
	// they decode to (see "Memory" in the package documentation). The
	// runner's memory for messages stays below 1.5 × MaxBufferedBytes +
	// assigned partitions × (64 KiB + 3 × the largest record batch).
	// Defaults to 8 MiB: thousands of small messages per partition, several
	// batches of BatchSize ahead, and as fast as 16 MiB in scripts/bench.
	MaxBufferedBytes int64
	// HeldWarnAfter is how long a partition may wait behind an open
	// transaction of a transactional producer before the runner logs it
	// (WARN) and tells HeldObservers. Defaults to 30s.
	HeldWarnAfter time.Duration
	// MaxOutage bounds how long the runner waits out a PostgreSQL or Kafka
	// server it cannot reach (connection-class errors; see
	// retry.IsConnection). Past it Run returns a *retry.OutageError. Defaults
	// to 0: the runner waits for ever, logging each outage when it starts
	// and when it ends.
	MaxOutage time.Duration
	// SessionTimeout is the consumer group session timeout: a member that
	// sends no heartbeat for that long (a killed process) is removed and its
	// partitions go to others. Defaults to 10s.
	SessionTimeout time.Duration
	// HeartbeatInterval is how often the member sends a heartbeat, and so
	// how soon it notices a rebalance. Defaults to 1s; it must be less than
	// SessionTimeout.
	HeartbeatInterval time.Duration
	// RebalanceTimeout is how long the group waits, during a rebalance, for
	// its members to stop their work and rejoin; a member that takes longer
	// (a handler that does not return when its context is cancelled) is
	// removed, which costs another rebalance, never correctness. It is also
	// how long the group waits for a member that was killed: a replacement
	// that joins starts a rebalance at once, and the group resumes after
	// min(SessionTimeout, RebalanceTimeout) (test/cmd/idemkit-churn
	// measures that pause). It must exceed HeartbeatInterval plus the time
	// your handler takes to stop. Defaults to 5s.
	RebalanceTimeout time.Duration
	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observers watch the runner (metrics, tracing, tests): each takes
	// the events of the observer interfaces it implements (see Observer).
	Observers []Observer
}

// Outcome is what became of a message.
type Outcome int

const (
	// Applied: the ID was newly claimed and the handler's effect committed.
	Applied Outcome = iota + 1
	// Duplicate: the ID was already claimed; the handler did not run.
	Duplicate
	// Failed: the handler failed for good and OnFailure took the message.
	Failed
	// Parked: the message waits in PostgreSQL behind a failure of its key
	// (NonBlocking mode); a later Applied, Duplicate or Failed follows.
	Parked
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Failed:
		return "failed"
	case Parked:
		return "parked"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// ErrInvalidConfig is wrapped by every configuration error New returns.
var ErrInvalidConfig = fmt.Errorf("consumer: %w", idemkit.ErrInvalidConfig)

// Validate reports what New would refuse in c: a missing or contradictory
// field, a value out of range. New calls it; call it yourself to check a
// configuration read from a file before anything connects. The error wraps
// ErrInvalidConfig.
func (c *Config) Validate() error {
	if c == nil {
		return fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	_, err := c.withDefaults()
	return err
}

func (c Config) withDefaults() (Config, error) {
	c.Name = cmp.Or(c.Name, c.GroupID)
	c.IDHeader = cmp.Or(c.IDHeader, IDHeaderDefault)
	c.BatchSize = cmp.Or(c.BatchSize, BatchSizeDefault)
	c.BatchLinger = cmp.Or(c.BatchLinger, BatchLingerDefault)
	c.MaxPartitions = cmp.Or(c.MaxPartitions, MaxPartitionsDefault)
	c.StartOffset = cmp.Or(c.StartOffset, kafka.FirstOffset)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, SessionTimeoutDefault)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, min(HeartbeatIntervalDefault, c.SessionTimeout/3))
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, RebalanceTimeoutDefault)
	c.MaxBufferedBytes = cmp.Or(c.MaxBufferedBytes, MaxBufferedBytesDefault)
	c.HeldWarnAfter = cmp.Or(c.HeldWarnAfter, HeldWarnAfterDefault)
	if reflect.ValueOf(c.ParkedRetry).IsZero() {
		c.ParkedRetry = parkedRetryDefault
	}
	c.ParkedPoll = cmp.Or(c.ParkedPoll, ParkedPollDefault)
	c.PurgeInterval = cmp.Or(c.PurgeInterval, PurgeIntervalDefault)
	c.HandlerTimeout = cmp.Or(c.HandlerTimeout, HandlerTimeoutDefault)
	if c.Retention > 0 {
		c.HorizonMargin = cmp.Or(c.HorizonMargin, min(c.Retention/10, HorizonMarginMax))
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Store == nil {
		s, err := dedup.New(nil)
		if err != nil {
			return c, err
		}
		c.Store = s
	}
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if _, err := newObservers(c.Observers); err != nil {
		return c, err
	}
	switch {
	case c.Kafka.Validate() != nil:
		return c, fmt.Errorf("%w: Kafka: %w", ErrInvalidConfig, c.Kafka.Validate())
	case c.Topic == "":
		return c, invalid("Topic is empty")
	case c.GroupID == "":
		return c, invalid("GroupID is empty")
	case c.Handler == nil && c.BatchHandler == nil:
		return c, invalid("set Handler or BatchHandler")
	case c.Handler != nil && c.BatchHandler != nil:
		return c, invalid("set Handler or BatchHandler, not both")
	case c.BatchSize < 1:
		return c, invalid("BatchSize %d < 1", c.BatchSize)
	case c.BatchLinger < 0:
		return c, invalid("BatchLinger %s < 0", c.BatchLinger)
	case c.MaxPartitions < 1:
		return c, invalid("MaxPartitions %d < 1", c.MaxPartitions)
	case c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset:
		return c, invalid("StartOffset must be kafka.FirstOffset or kafka.LastOffset")
	case c.Retry.Validate() != nil:
		return c, invalid("Retry: %v", c.Retry.Validate())
	case c.ParkedRetry.Validate() != nil:
		return c, invalid("ParkedRetry: %v", c.ParkedRetry.Validate())
	case c.FailureMode != Blocking && c.FailureMode != NonBlocking:
		return c, invalid("unknown FailureMode %d", c.FailureMode)
	case c.ParkedPoll < 0:
		return c, invalid("ParkedPoll %s < 0", c.ParkedPoll)
	case c.Retention < 0, c.PurgeInterval < 0:
		return c, invalid("Retention and PurgeInterval must not be negative")
	case c.OnBeyondHorizon != HorizonFail && c.OnBeyondHorizon != HorizonApply:
		return c, invalid("unknown OnBeyondHorizon policy %d", c.OnBeyondHorizon)
	case c.HorizonMargin < 0, c.Retention > 0 && c.HorizonMargin >= c.Retention:
		return c, invalid("HorizonMargin %s must be at least 0 and less than Retention %s", c.HorizonMargin, c.Retention)
	case c.SessionTimeout < 0, c.HeartbeatInterval < 0, c.RebalanceTimeout < 0:
		return c, invalid("SessionTimeout, HeartbeatInterval and RebalanceTimeout must not be negative")
	case c.HeartbeatInterval >= c.SessionTimeout:
		return c, invalid("HeartbeatInterval %s must be less than SessionTimeout %s", c.HeartbeatInterval, c.SessionTimeout)
	case c.HeartbeatInterval >= c.RebalanceTimeout:
		return c, invalid("HeartbeatInterval %s must be less than RebalanceTimeout %s", c.HeartbeatInterval, c.RebalanceTimeout)
	case c.MaxBufferedBytes < 0:
		return c, invalid("MaxBufferedBytes %d < 0", c.MaxBufferedBytes)
	case c.HeldWarnAfter < 0:
		return c, invalid("HeldWarnAfter %s < 0", c.HeldWarnAfter)
	case c.HandlerTimeout < 0:
		return c, invalid("HandlerTimeout %v is negative", c.HandlerTimeout)
	case c.MaxOutage < 0:
		return c, invalid("MaxOutage %s < 0", c.MaxOutage)
	case c.OnRecreated != RecreatedStop && c.OnRecreated != RecreatedRestart:
		return c, invalid("unknown OnRecreated policy %d", c.OnRecreated)
	case c.MissingID != MissingIDFail && c.MissingID != MissingIDUseCoordinates:
		return c, invalid("unknown MissingID policy %d", c.MissingID)
	case c.Handler == nil && len(c.Middleware) > 0:
		return c, invalid("Middleware wraps Handler, which is not set (BatchMiddleware wraps BatchHandler)")
	case c.BatchHandler == nil && len(c.BatchMiddleware) > 0:
		return c, invalid("BatchMiddleware wraps BatchHandler, which is not set (Middleware wraps Handler)")
	}
	for i := len(c.Middleware) - 1; i >= 0; i-- {
		if c.Middleware[i] == nil {
			return c, invalid("Middleware[%d] is nil", i)
		}
		if c.Handler = c.Middleware[i](c.Handler); c.Handler == nil {
			return c, invalid("Middleware[%d] returned a nil Handler", i)
		}
	}
	for i := len(c.BatchMiddleware) - 1; i >= 0; i-- {
		if c.BatchMiddleware[i] == nil {
			return c, invalid("BatchMiddleware[%d] is nil", i)
		}
		if c.BatchHandler = c.BatchMiddleware[i](c.BatchHandler); c.BatchHandler == nil {
			return c, invalid("BatchMiddleware[%d] returned a nil BatchHandler", i)
		}
	}
	if err := dedup.ValidateID("consumer name", c.Name); err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return c, nil
}
