package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/retry"
)

// Handler performs one non-Kafka side effect: send an e-mail, call a payment
// provider. It may run more than once for one message (after a crash, a
// timeout, a lost commit): pass rec.ID to the provider as its idempotency
// key so that the effect happens once. Returning an error retries the message
// with backoff; an error wrapped with retry.Permanent makes it dead at once.
type Handler interface {
	Handle(ctx context.Context, rec *Record) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, rec *Record) error

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, rec *Record) error { return f(ctx, rec) }

// DispatcherConfig configures a Dispatcher. Handlers is required.
type DispatcherConfig struct {
	// Handlers maps Message.Handler names to handlers. The dispatcher
	// claims only messages whose handler it has.
	Handlers map[string]Handler

	// BatchSize is the most messages one round claims. Defaults to 500.
	BatchSize int
	// HandlerTimeout bounds one handler call. Defaults to 30s.
	HandlerTimeout time.Duration
	// PollInterval, Retry, Retention, CleanupInterval, CleanupBatch,
	// StatsInterval, DisableListen and MaxOutage mean what they mean in
	// RelayConfig, with the same defaults (MaxOutage concerns PostgreSQL
	// only). Every handler failure counts towards Retry.MaxAttempts.
	PollInterval    time.Duration
	Retry           retry.Policy
	Retention       time.Duration
	CleanupInterval time.Duration
	CleanupBatch    int
	StatsInterval   time.Duration
	DisableListen   bool
	MaxOutage       time.Duration

	// Logger receives structured logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Observers watch the dispatcher, as RelayConfig.Observers the relay;
	// a PublishEvent's records were handled.
	Observers []Observer
}

// Dispatcher runs registered handlers for outbox messages enqueued with
// Message.Handler set, after their transaction committed, at least once,
// in enqueue order per (Handler, Key). Any number of dispatchers may run
// at once.
type Dispatcher struct {
	pool     *pgxpool.Pool
	store    *Store
	handlers map[string]Handler
	names    []string
	timeout  time.Duration
	loop     loopConfig
	turn     atomic.Uint64 // which handler a round scans first
}

// NewDispatcher validates cfg, applies its defaults and returns a Dispatcher.
func NewDispatcher(pool *pgxpool.Pool, store *Store, cfg *DispatcherConfig) (*Dispatcher, error) {
	switch {
	case pool == nil:
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	case store == nil:
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	case cfg == nil:
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	case len(cfg.Handlers) == 0:
		return nil, fmt.Errorf("%w: no Handlers", ErrInvalidConfig)
	}
	d := &Dispatcher{pool: pool, store: store, handlers: map[string]Handler{},
		timeout: cmp.Or(cfg.HandlerTimeout, HandlerTimeoutDefault)}
	for name, h := range cfg.Handlers {
		if name == "" || h == nil {
			return nil, fmt.Errorf("%w: handler %q: empty name or nil handler", ErrInvalidConfig, name)
		}
		d.handlers[name] = h
		d.names = append(d.names, name)
	}
	slices.Sort(d.names)
	if d.timeout <= 0 {
		return nil, fmt.Errorf("%w: HandlerTimeout %v <= 0", ErrInvalidConfig, d.timeout)
	}
	rc := RelayConfig{BatchSize: cfg.BatchSize, PollInterval: cfg.PollInterval, Retry: cfg.Retry,
		Retention: cfg.Retention, CleanupInterval: cfg.CleanupInterval, CleanupBatch: cfg.CleanupBatch,
		StatsInterval: cfg.StatsInterval, DisableListen: cfg.DisableListen, MaxOutage: cfg.MaxOutage,
		Logger: cfg.Logger, Observers: cfg.Observers}
	l, err := rc.loop()
	if err != nil {
		return nil, err
	}
	l.name = "dispatcher"
	// A round starts no handler after HandlerTimeout: its transaction sits
	// idle for two HandlerTimeouts at most.
	l.txBudget = 2 * d.timeout
	d.loop = l
	return d, nil
}

// Run dispatches until ctx ends, then returns nil, only after every goroutine
// it started has exited. It returns an error wrapping ErrNotMigrated when the
// table is missing, and a *retry.OutageError when PostgreSQL stayed
// unreachable for longer than MaxOutage (never, by default); outages are
// waited out with backoff and logged once, as the relay does.
func (d *Dispatcher) Run(ctx context.Context) error {
	e := &engine{pool: d.pool, store: d.store, cfg: d.loop, d: d,
		log: d.loop.logger.With("component", "outbox.dispatcher")}
	pgsession.Check(ctx, d.pool, &d.pool.Config().ConnConfig.Config, d.loop.logger, "outbox.dispatcher") // e.log already names the component
	return e.run(ctx)
}

// scan scans handler after handler until limit rows are found, starting
// each round with the next handler, so that a busy handler cannot keep the
// others waiting for more than a round.
func (d *Dispatcher) scan(ctx context.Context, tx pgx.Tx, limit int) ([]scanned, error) {
	start := int(d.turn.Add(1) % uint64(len(d.names)))
	var out []scanned
	for i := range d.names {
		found, err := scanRows(ctx, tx, d.store.sql.scanHandler, limit-len(out), d.names[(start+i)%len(d.names)])
		if err != nil {
			return nil, err
		}
		if out = append(out, found...); len(out) >= limit {
			break
		}
	}
	return out, nil
}

func (d *Dispatcher) cut(rows []*row) int { return len(rows) }

// deliver runs the handlers one message at a time, in enqueue order; a key
// whose message failed is held until the next round. Once HandlerTimeout
// has passed since the round's first handler started, the rest is left for
// the next round: the round's transaction stays idle for a bounded time.
func (d *Dispatcher) deliver(ctx context.Context, rows []*row) []error {
	errs := make([]error, len(rows))
	held := map[int64]bool{}
	start := time.Now()
	for i, r := range rows {
		if held[r.lockKey] {
			errs[i] = errHeld
			continue
		}
		if i > 0 && time.Since(start) >= d.timeout {
			for j := i; j < len(rows); j++ {
				errs[j] = errNotAttempted
			}
			break
		}
		if err := d.call(ctx, r); err != nil {
			errs[i] = err
			held[r.lockKey] = true
		}
		if ctx.Err() != nil {
			for j := i + 1; j < len(rows); j++ {
				errs[j] = ctx.Err()
			}
			break
		}
	}
	return errs
}

func (d *Dispatcher) call(ctx context.Context, r *row) (err error) {
	h := d.handlers[r.rec.Handler]
	if h == nil { // a handler removed between scan and now cannot happen; be safe
		return fmt.Errorf("outbox: no handler %q", r.rec.Handler)
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	defer func() {
		if v := recover(); v != nil {
			err = idemkit.NewPanicError("outbox: handler", v) // retried like any failure
		}
	}()
	rec := r.rec
	return h.Handle(ctx, &rec)
}

func (d *Dispatcher) classify(err error) verdict {
	if isPermanent(err) {
		return permanentFailure
	}
	return countedFailure
}
