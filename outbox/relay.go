package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/retry"
)

// Defaults of RelayConfig and DispatcherConfig.
const (
	BatchSizeDefault      = 500
	MaxBatchBytesDefault  = 1 << 20 // kafka-go's and Kafka's default limit
	PollIntervalDefault   = 500 * time.Millisecond
	WakeDelayDefault      = 5 * time.Millisecond
	PublishTimeoutDefault = 10 * time.Second
	MetadataTTLDefault    = 2 * time.Second
	HandlerTimeoutDefault = 30 * time.Second
	// DeadAfterDefault is the failed attempts after which a message is dead
	// when Retry.MaxAttempts is zero.
	DeadAfterDefault       = 10
	RetentionDefault       = 24 * time.Hour
	CleanupIntervalDefault = time.Minute
	StatsIntervalDefault   = 10 * time.Second
)

// ErrInvalidConfig is wrapped by every configuration error NewRelay and
// NewDispatcher return.
var ErrInvalidConfig = fmt.Errorf("outbox: %w", idemkit.ErrInvalidConfig)

// ErrMessageTooLarge is the error of a message bigger than the relay's
// MaxBatchBytes: it is dead at once.
var ErrMessageTooLarge = errors.New("outbox: message larger than MaxBatchBytes")

// RelayConfig configures a Relay. Kafka.Brokers is required.
type RelayConfig struct {
	// Kafka is how to reach the cluster: its brokers, TLS and SASL (see
	// package kafkaconn). The relay makes its transport from it and closes it
	// when Run returns.
	Kafka kafkaconn.Config
	// MetadataTTL is how long the relay trusts the topic metadata it read:
	// how long a topic created while the relay runs may still look missing
	// (its messages fail and are retried meanwhile). Defaults to 2s.
	MetadataTTL time.Duration

	// BatchSize is the most messages one round claims and publishes.
	// Defaults to 500.
	BatchSize int
	// MaxBatchBytes bounds one round's messages, in bytes as Kafka counts
	// them (roughly): a round goes out as one produce request per partition
	// leader, with one record batch per partition, each all or nothing. A bigger message is dead at once, with
	// ErrMessageTooLarge. It must not exceed the broker's message.max.bytes.
	// Defaults to 1 MiB.
	MaxBatchBytes int
	// PollInterval is how often the relay looks for due messages when no
	// notification woke it (delayed messages, retries, a lost LISTEN).
	// Defaults to 500ms.
	PollInterval time.Duration
	// WakeDelay is how long an idle relay waits, after the NOTIFY of a
	// commit woke it, before it reads: the commits of a burst then cost one
	// round, and a steady trickle one round per WakeDelay at most. It adds
	// up to WakeDelay to the latency of a message that finds the relay
	// idle; a relay that is busy (its last round was full) does not wait.
	// Negative means no wait. Defaults to 5ms.
	WakeDelay time.Duration
	// PublishTimeout bounds one round's Kafka writes. Defaults to 10s.
	PublishTimeout time.Duration
	// Retry paces a failing message's attempts: InitialInterval after the
	// first failure, growing by Multiplier (with RandomizationFactor's
	// jitter) up to MaxInterval, as for the consumer; MaxAttempts failed
	// attempts make the message dead (negative: never). Failures of the
	// connection to Kafka (broker down, leader elections, timeouts) are
	// retried without end and never make it dead. MaxElapsedTime and Classifier are
	// not used. Defaults to the zero Policy's 100ms to 10s, and 10
	// attempts (DeadAfterDefault).
	Retry retry.Policy
	// Retention is how long published rows are kept before cleanup deletes
	// them. Negative disables cleanup in this relay. Defaults to 24h.
	Retention time.Duration
	// CleanupInterval is how often published rows past Retention are
	// deleted, in batches of CleanupBatch. Defaults to 1m.
	CleanupInterval time.Duration
	// CleanupBatch is the most rows one cleanup statement deletes.
	// Defaults to 1000.
	CleanupBatch int
	// StatsInterval is how often StatsObservers get the backlog (only when
	// there are any). Defaults to 10s.
	StatsInterval time.Duration
	// DisableListen turns off LISTEN/NOTIFY wake-ups: the relay only polls.
	// Defaults to false.
	DisableListen bool
	// MaxOutage bounds how long the relay waits for PostgreSQL or Kafka
	// when it cannot reach them (connection refused or lost, broker not
	// available, timeouts: retry.IsConnection). Meanwhile it backs off with
	// jitter and logs the outage once when it starts and once when it ends;
	// past MaxOutage, Run returns a *retry.OutageError (errors.Is(err,
	// retry.ErrOutage)). Defaults to 0: wait for ever.
	MaxOutage time.Duration

	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observers watch the relay (metrics, tracing, tests): each takes the
	// events of the observer interfaces it implements (see Observer).
	Observers []Observer
}

func (c *RelayConfig) loop() (loopConfig, error) {
	l := loopConfig{
		name:            "relay",
		batchSize:       cmp.Or(c.BatchSize, BatchSizeDefault),
		pollInterval:    cmp.Or(c.PollInterval, PollIntervalDefault),
		retry:           c.Retry,
		deadAfter:       cmp.Or(c.Retry.MaxAttempts, DeadAfterDefault),
		retention:       cmp.Or(c.Retention, RetentionDefault),
		cleanupInterval: cmp.Or(c.CleanupInterval, CleanupIntervalDefault),
		cleanupBatch:    cmp.Or(c.CleanupBatch, CleanupBatchDefault),
		statsInterval:   cmp.Or(c.StatsInterval, StatsIntervalDefault),
		disableListen:   c.DisableListen,
		maxOutage:       c.MaxOutage,
		logger:          cmp.Or(c.Logger, slog.Default()),
	}
	obs, err := newObservers(c.Observers)
	if err != nil {
		return l, err
	}
	l.obs = obs
	return l, l.validate()
}

func (l loopConfig) validate() error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case l.batchSize < 1:
		return invalid("BatchSize %d < 1", l.batchSize)
	case l.pollInterval <= 0:
		return invalid("PollInterval %v <= 0", l.pollInterval)
	case l.retry.Validate() != nil:
		return invalid("Retry: %v", l.retry.Validate())
	case l.cleanupInterval <= 0:
		return invalid("CleanupInterval %v <= 0", l.cleanupInterval)
	case l.cleanupBatch < 1:
		return invalid("CleanupBatch %d < 1", l.cleanupBatch)
	case l.statsInterval <= 0:
		return invalid("StatsInterval %v <= 0", l.statsInterval)
	case l.maxOutage < 0:
		return invalid("MaxOutage %v < 0", l.maxOutage)
	}
	return nil
}

// Relay publishes committed outbox messages to Kafka. Create it with
// NewRelay; Run it once. Any number of relays (in one process or many) may
// run against the same table.
type Relay struct {
	pool  *pgxpool.Pool
	store *Store
	cfg   RelayConfig
	loop  loopConfig
	// onRound, for tests (export_test.go), runs after each round that read
	// rows, with the number it delivered.
	onRound func(delivered int)
}

// Validate reports what NewRelay would refuse in c: a missing or
// contradictory field, a value out of range. The error wraps
// ErrInvalidConfig.
func (c *RelayConfig) Validate() error {
	_, _, err := c.withDefaults()
	return err
}

// withDefaults checks c and returns it with its defaults applied, and the
// loop's configuration.
func (c *RelayConfig) withDefaults() (RelayConfig, loopConfig, error) {
	if c == nil {
		return RelayConfig{}, loopConfig{}, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	if err := c.Kafka.Validate(); err != nil {
		return RelayConfig{}, loopConfig{}, fmt.Errorf("%w: Kafka: %w", ErrInvalidConfig, err)
	}
	r := *c
	r.MaxBatchBytes = cmp.Or(r.MaxBatchBytes, MaxBatchBytesDefault)
	r.PublishTimeout = cmp.Or(r.PublishTimeout, PublishTimeoutDefault)
	r.WakeDelay = cmp.Or(r.WakeDelay, WakeDelayDefault)
	if r.MaxBatchBytes < 1024 {
		return r, loopConfig{}, fmt.Errorf("%w: MaxBatchBytes %d < 1024", ErrInvalidConfig, r.MaxBatchBytes)
	}
	if r.PublishTimeout <= 0 {
		return r, loopConfig{}, fmt.Errorf("%w: PublishTimeout %v <= 0", ErrInvalidConfig, r.PublishTimeout)
	}
	l, err := r.loop()
	return r, l, err
}

// NewRelay validates cfg, applies its defaults and returns a Relay. It does
// not connect to anything.
func NewRelay(pool *pgxpool.Pool, store *Store, cfg *RelayConfig) (*Relay, error) {
	switch {
	case pool == nil:
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	case store == nil:
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	c, l, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// A round's transaction sits idle while the round publishes.
	l.txBudget = c.PublishTimeout
	return &Relay{pool: pool, store: store, cfg: c, loop: l}, nil
}

// Run publishes until ctx ends, then returns nil, only after every goroutine
// it started has exited. It returns an error wrapping ErrNotMigrated when the
// table is missing, and a *retry.OutageError when PostgreSQL or Kafka stayed
// unreachable for longer than MaxOutage (never, by default). Outages are
// waited out with backoff, each logged once when it starts and once when it
// ends, an unreachable server at start included; other failures are logged
// and retried with backoff: the relay recovers by itself once they are
// resolved.
func (r *Relay) Run(ctx context.Context) error {
	transport, err := r.cfg.Kafka.Transport()
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	transport.MetadataTTL = cmp.Or(r.cfg.MetadataTTL, MetadataTTLDefault)
	defer transport.CloseIdleConnections()
	log := r.loop.logger.With("component", "outbox.relay")
	pgsession.Check(ctx, r.pool, &r.pool.Config().ConnConfig.Config, r.loop.logger, "outbox.relay") // log already names the component
	e := &engine{pool: r.pool, store: r.store, cfg: r.loop, log: log}
	e.rounds = &relayRounds{e: e, wakeDelay: r.cfg.WakeDelay, onRound: r.onRound,
		promoteEvery: min(r.loop.pollInterval, r.loop.retryInitial()),
		k: &kafkaDeliverer{transport: transport, addr: r.cfg.Kafka.Addr(), kafka: &r.cfg.Kafka, maxBytes: r.cfg.MaxBatchBytes,
			timeout: r.cfg.PublishTimeout}}
	return e.run(ctx)
}

// classify: broker and network trouble is transient (never dies); a
// message Kafka rejects as such is permanent; anything else, a missing
// topic included, counts towards Retry.MaxAttempts.
func (k *kafkaDeliverer) classify(err error) verdict {
	var (
		kerr kafka.Error
		nerr net.Error
	)
	switch {
	case isPermanent(err), errors.Is(err, ErrMessageTooLarge):
		return permanentFailure
	case kafkaconn.Classify(err) != nil:
		// Refused credentials or certificates are the relay's settings, not
		// the message's: never dead, retried until they are fixed.
		return transientFailure
	case errors.As(err, &kerr):
		switch kerr {
		case kafka.UnknownTopicOrPartition, kafka.InvalidMessage:
			return countedFailure
		case kafka.MessageSizeTooLarge, kafka.InvalidTopic, kafka.RecordListTooLarge, kafka.InvalidRecord:
			return permanentFailure
		}
		if kerr.Temporary() {
			return transientFailure
		}
		return countedFailure
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &nerr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.ErrClosedPipe),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return transientFailure
	}
	return countedFailure
}
