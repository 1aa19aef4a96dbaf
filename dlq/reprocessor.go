package dlq

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/user"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/pgexec"
	"github.com/idemkit/idemkit/internal/pgsession"
	"github.com/idemkit/idemkit/internal/pgtext"
	"github.com/idemkit/idemkit/internal/topicscan"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// Mode is how a reprocessor replays a dead letter.
type Mode int

const (
	// Redrive runs the dead letter through Handler in the same idempotent
	// path as the consumer: one transaction claims the original message ID
	// under the original consumer name (the same dedup scope), runs the
	// handler, and records the replay.
	Redrive Mode = iota + 1
	// Republish writes the original message back to its origin topic, where
	// the consumer handles it again; its dedup makes that harmless. The
	// message carries its lineage (HeaderLineage), so that a dead letter
	// written when it fails again continues its history.
	Republish
)

// Action is what a reprocessor did with one dead letter.
type Action string

// Actions a reprocessor reports.
const (
	Applied         Action = "applied"           // redriven: the handler's effect committed
	AlreadyApplied  Action = "already-applied"   // the message ID was already processed: nothing re-run
	AlreadyReplayed Action = "already-replayed"  // this dead letter was replayed before: no-op
	Republished     Action = "republished"       // written back to its origin topic
	RepublishedNoID Action = "republished-no-id" // written back without a usable message ID (see NoMessageID)
	FailedAgain     Action = "failed-again"      // failed again: back to a dead-letter topic (see Destination), history extended
	Exhausted       Action = "exhausted"         // its replay rounds are used up: recorded, not replayed again
	NoMessageID     Action = "no-message-id"     // Redrive: no usable message ID, so no dedup: left alone
	BeyondHorizon   Action = "beyond-horizon"    // past the dedup horizon (see ReprocessorConfig.Retention), or its daily partition dropped: left alone
	WriteFailed     Action = "write-failed"      // could not be written back (see Item.Err): recorded, tried again by the next run
	ValueNotFound   Action = "value-not-found"   // its stored value is missing or differs (ErrValueNotFound): left alone
	Skipped         Action = "skipped"           // not selected by the filter
	WouldReplay     Action = "would-replay"      // dry run: would be replayed
	Unreadable      Action = "unreadable"        // not an idemkit dead letter
)

// ErrReplayLimit is the Err of an Item exhausted because its dead letter had
// used up its replay rounds before this run.
var ErrReplayLimit = errors.New("dlq: replay limit reached")

// Defaults of ReprocessorConfig.
const (
	ReplayLimitDefault = 3
	// HandlerTimeoutDefault bounds one run of Handler.
	HandlerTimeoutDefault = 30 * time.Second
)

// ReprocessorConfig configures a Reprocessor. Kafka.Brokers, Topic and Mode
// are required, and Handler in Redrive mode; the pool is NewReprocessor's
// first argument, as in every idemkit constructor.
type ReprocessorConfig struct {
	// Kafka is how to reach the cluster: its brokers, TLS and SASL (see
	// package kafkaconn). The scans of the dead-letter topic and the writes
	// back go through it; Close closes its connections.
	Kafka kafkaconn.Config
	// Topic is the dead-letter topic to replay.
	Topic string
	// Destination chooses the dead-letter topic a dead letter that fails
	// again in Redrive mode is written back to, from the message and its
	// new failure (a *consumer.MessageError): give it the consumer's
	// Writer.Route, so that it goes where the consumer would send it (its
	// lineage, origin and history, goes with it). In Republish mode the
	// consumer's Writer routes. Defaults to Topic.
	Destination func(msg *consumer.Message, err error) string
	// Mode is Redrive or Republish.
	Mode Mode
	// Handler re-runs a message in Redrive mode: the consumer's handler.
	Handler consumer.Handler
	// HandlerTimeout bounds one run of Handler (its context's deadline;
	// a run that outlasts it failed, and is retried under Retry), and so
	// how long its transaction may sit idle: PostgreSQL ends the
	// transaction once it stays idle HandlerTimeout plus 10s (its client
	// went away), and the transaction's statements give up after as long,
	// on a connection gone silent, to try again on a new one. Defaults to
	// 30s.
	HandlerTimeout time.Duration

	// pool is where dedup records and replay records live:
	// NewReprocessor's argument.
	pool *pgxpool.Pool
	// Tables says where the dedup, replay records and stored values tables
	// live (migrate.Tables; the zero value: schema "public", every default
	// name).
	Tables migrate.Tables

	// Filter selects which dead letters to replay.
	Filter Filter
	// DryRun lists what would be done and changes nothing.
	DryRun bool
	// Rate bounds replays per second. Defaults to 0: no bound.
	Rate float64
	// ReplayLimit is how many replay rounds a dead letter gets. One that
	// fails again in its last round is exhausted (recorded, not written back)
	// in Redrive mode; in Republish mode the consumer dead-letters it once
	// more, and the next run exhausts that dead letter. Defaults to 3.
	ReplayLimit int
	// Retention is the consumers' dedup retention (consumer.Config.Retention).
	// With it set, a dead letter whose message ID the dedup store does not
	// hold, and whose original message (Origin.Time) is older than the
	// horizon — Retention minus the consumer's default HorizonMargin — is
	// BeyondHorizon with a *consumer.HorizonError, as the consumer would
	// refuse it: it may have been applied and its record purged since, and
	// replaying it could apply it twice. It is left alone, unrecorded, for a
	// run that opts in (OnBeyondHorizon). Defaults to 0: not checked.
	Retention time.Duration
	// OnBeyondHorizon says what happens to a dead letter past the horizon
	// of Retention: consumer.HorizonFail reports it as BeyondHorizon;
	// consumer.HorizonApply replays it like any other. A dead letter whose
	// daily dedup partition was dropped cannot be claimed at all: it is
	// BeyondHorizon (recorded) whatever this says. Defaults to
	// consumer.HorizonFail.
	OnBeyondHorizon consumer.HorizonPolicy
	// ReplayedBy is recorded as who replayed. Defaults to user@host.
	ReplayedBy string
	// Retry paces the handler's attempts within one replay and writes to
	// Kafka that fail for another reason than an outage. Defaults to the
	// zero retry.Policy.
	Retry retry.Policy
	// MaxOutage bounds how long Run waits while PostgreSQL or Kafka cannot be
	// reached (see retry.IsConnection): it backs off, logs the outage once
	// when it starts and once with its duration when it ends, goes on where
	// it was, and returns a *retry.OutageError (errors.Is retry.ErrOutage)
	// once an outage lasted longer, checked between two tries. An outage
	// never counts as a dead letter failing again. Defaults to 0: wait for
	// ever.
	MaxOutage time.Duration
	// Progress, when set, is called once per dead letter with what was done.
	Progress func(Item)
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Item is one dead letter and what was done with it.
type Item struct {
	// DeadLetter is nil for an unreadable message (see Raw).
	DeadLetter *DeadLetter
	Raw        kafka.Message
	// Action is what was done; in a dry run, what would be done.
	Action Action
	// Err is the dead letter's own error: the handler's for FailedAgain and
	// Exhausted, ErrReplayLimit for a dead letter exhausted without a new round,
	// ErrNoMessageID for NoMessageID and RepublishedNoID, ErrNotDeadLetter for
	// Unreadable, ErrValueNotFound for ValueNotFound, and for WriteFailed the
	// write's error, naming the letter.
	Err error
}

// Counts counts dead letters by Action.
type Counts map[Action]int

// Summary is what one Run did, counted two ways.
type Summary struct {
	// Records counts dead-letter records, one per Item: the same message
	// dead-lettered twice (see "Dead-lettering" in the package doc), or in
	// two replay rounds, counts twice.
	Records Counts
	// Messages counts distinct origin messages (origin topic, incarnation,
	// partition and offset), each once, under the Action of its dead letter
	// of the highest round read (of its copies, the first); each
	// unreadable record counts as one message.
	Messages Counts
}

// originKey identifies an origin message.
type originKey struct {
	topic               string
	incarnation, offset int64
	partition           int
}

// letterKey identifies a dead letter: its origin and round.
type letterKey struct {
	originKey
	round int
}

func keyOf(d *DeadLetter) letterKey {
	return letterKey{d.Origin.key(), d.Round}
}

func (o Origin) key() originKey {
	return originKey{o.Topic, o.Incarnation, o.Offset, o.Partition}
}

// tally builds a Summary.
type tally struct {
	sum    Summary
	latest map[originKey]letterAction
}

type letterAction struct {
	round  int
	action Action
}

func (t *tally) add(it Item) {
	t.sum.Records[it.Action]++
	if it.DeadLetter == nil {
		t.sum.Messages[it.Action]++
		return
	}
	k := keyOf(it.DeadLetter)
	if prev, ok := t.latest[k.originKey]; !ok || k.round > prev.round {
		t.latest[k.originKey] = letterAction{k.round, it.Action}
	}
}

func (t *tally) summary() Summary {
	for _, la := range t.latest {
		t.sum.Messages[la.action]++
	}
	return t.sum
}

// dryRun is what a dry run decided so far, that the real run would have
// written down by then: a dry run consults it where the real run reads
// its records and its claims.
type dryRun struct {
	recorded map[letterKey]bool // replay records the real run would have written
	claimed  map[claimKey]bool  // Redrive: message IDs it would have claimed
}

type claimKey struct{ consumer, id string }

// remember notes what the real run would have written for d, done as a.
func (dr *dryRun) remember(d *DeadLetter, a Action, mode Mode) {
	switch a {
	case WouldReplay:
		if mode == Redrive {
			dr.claimed[claimKey{d.Consumer, d.MessageID}] = true
		}
	case AlreadyApplied, Exhausted:
	default:
		return // nothing recorded: NoMessageID, BeyondHorizon left alone
	}
	dr.recorded[keyOf(d)] = true
}

// Reprocessor replays a dead-letter topic once, from its start to the end it
// has when Run starts.
type Reprocessor struct {
	cfg     ReprocessorConfig
	store   *dedup.Store
	replays string // quoted table
	back    *Writer
	// client reads the dead-letter topic; closeClient closes its connections.
	client      *kafka.Client
	closeClient func()
}

// Validate reports what NewReprocessor would refuse in c: a missing or
// contradictory field, a value out of range, a table name that is not one.
// The error wraps ErrInvalidConfig.
func (c *ReprocessorConfig) Validate() error {
	_, err := c.withDefaults()
	return err
}

// withDefaults checks c and returns it with its defaults applied.
func (c *ReprocessorConfig) withDefaults() (ReprocessorConfig, error) {
	if c == nil {
		return ReprocessorConfig{}, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	invalid := func(msg string) error { return fmt.Errorf("%w: %s", ErrInvalidConfig, msg) }
	if err := c.Kafka.Validate(); err != nil {
		return ReprocessorConfig{}, fmt.Errorf("%w: Kafka: %w", ErrInvalidConfig, err)
	}
	switch {
	case c.Topic == "":
		return ReprocessorConfig{}, invalid("Topic is empty")
	case c.Mode != Redrive && c.Mode != Republish:
		return ReprocessorConfig{}, invalid("Mode must be Redrive or Republish")
	case c.Mode == Redrive && c.Handler == nil:
		return ReprocessorConfig{}, invalid("Redrive needs a Handler")
	case c.Rate < 0:
		return ReprocessorConfig{}, invalid("Rate must not be negative")
	case c.ReplayLimit < 0:
		return ReprocessorConfig{}, invalid("ReplayLimit must not be negative")
	case c.MaxOutage < 0:
		return ReprocessorConfig{}, invalid("MaxOutage must not be negative")
	case c.Retention < 0:
		return ReprocessorConfig{}, invalid("Retention must not be negative")
	case c.OnBeyondHorizon != consumer.HorizonFail && c.OnBeyondHorizon != consumer.HorizonApply:
		return ReprocessorConfig{}, invalid("OnBeyondHorizon must be consumer.HorizonFail or consumer.HorizonApply")
	case c.HandlerTimeout < 0:
		return ReprocessorConfig{}, invalid("HandlerTimeout must not be negative")
	}
	r := *c
	r.HandlerTimeout = cmp.Or(r.HandlerTimeout, HandlerTimeoutDefault)
	r.ReplayLimit = cmp.Or(r.ReplayLimit, ReplayLimitDefault)
	r.ReplayedBy = cmp.Or(r.ReplayedBy, whoami())
	if reflect.ValueOf(r.Retry).IsZero() {
		// The zero Policy's bounds, said out loud: the writer's zero means
		// no bound.
		r.Retry = retry.Policy{MaxAttempts: retry.MaxAttemptsDefault}
	}
	if err := r.Retry.Validate(); err != nil {
		return ReprocessorConfig{}, fmt.Errorf("%w: Retry: %v", ErrInvalidConfig, err)
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	if err := r.Tables.Validate(); err != nil {
		return ReprocessorConfig{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return r, nil
}

// NewReprocessor validates cfg and returns a Reprocessor whose dedup and
// replay records live in pool. Close it when done.
func NewReprocessor(pool *pgxpool.Pool, cfg *ReprocessorConfig) (*Reprocessor, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c.pool = pool
	tables := c.Tables.WithDefaults()
	store, err := dedup.New(&dedup.Config{Tables: tables})
	if err != nil {
		return nil, err
	}
	back, err := newWriter(&WriterConfig{Kafka: c.Kafka, Topic: c.Topic, Retry: c.Retry, Logger: c.Logger,
		MaxOutage: c.MaxOutage, Pool: pool, Tables: tables})
	if err != nil {
		return nil, err
	}
	client, closeClient, err := newClient(&c.Kafka)
	if err != nil {
		_ = back.Close()
		return nil, err
	}
	return &Reprocessor{cfg: c, store: store, back: back, client: client, closeClient: closeClient,
		replays: pgx.Identifier{tables.Schema, tables.DLQReplays}.Sanitize()}, nil
}

// Close releases the Kafka writer and connections.
func (r *Reprocessor) Close() error {
	err := r.back.Close()
	r.closeClient()
	return err
}

func whoami() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + cmp.Or(host, "unknown")
}

// run is one Run: the reprocessor and the outages of its two servers.
type run struct {
	*Reprocessor
	pg, kafka *outage.Waiter
	dry       *dryRun     // nil unless DryRun
	held      *replayLock // the topic's replay lock; nil in a dry run
}

// Run replays every selected dead letter once and returns what it did (see
// Summary: per dead-letter record and per origin message). A dead letter's
// own trouble (no message ID, a handler that fails again, a write back that
// fails, a stored value that is missing) is that dead letter's Action,
// never the end of the run. A dead letter whose value was stored apart (see
// WriterConfig.Pool) is replayed with that value. Run waits out
// outages of PostgreSQL and Kafka (see MaxOutage) and goes on where it was;
// it stops at the first other error it cannot attribute to one dead letter.
// Running it again is safe: dead letters already replayed are recognised
// and left alone. One replay of a topic runs at a time: while another holds
// the topic's lock (in this process or another on the same database) Run
// returns ErrReplayRunning at once, having done nothing. Should the session
// holding its lock be lost during the run, Run takes the lock again (waiting
// out an outage), or stops with ErrReplayLockLost when another replay took
// it meanwhile. A dry run takes no lock and decides each dead letter
// as the real run would at that point, remembering what it decided for the dead letters before:
// a second copy of a dead letter is AlreadyReplayed, and in Redrive mode a
// message ID already decided for replay is AlreadyApplied.
func (r *Reprocessor) Run(ctx context.Context) (Summary, error) {
	tl := &tally{sum: Summary{Records: Counts{}, Messages: Counts{}}, latest: map[originKey]letterAction{}}
	var pace <-chan time.Time
	if r.cfg.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / r.cfg.Rate))
		defer t.Stop()
		pace = t.C
	}
	pgsession.Check(ctx, r.cfg.pool, &r.cfg.pool.Config().ConnConfig.Config, r.cfg.Logger, "dlq reprocessor "+r.cfg.Topic)
	rn := &run{Reprocessor: r,
		pg: &outage.Waiter{Op: "replay " + r.cfg.Topic + ": postgres", Log: r.cfg.Logger, Max: r.cfg.MaxOutage,
			Bound: pgsession.Timeout(r.cfg.HandlerTimeout)}, // a silent connection is given up on
		kafka: &outage.Waiter{Op: "replay " + r.cfg.Topic + ": kafka", Log: r.cfg.Logger, Max: r.cfg.MaxOutage}}
	if r.cfg.DryRun {
		rn.dry = &dryRun{recorded: map[letterKey]bool{}, claimed: map[claimKey]bool{}}
	} else {
		lk, err := rn.lock(ctx)
		if err != nil {
			return tl.summary(), err
		}
		defer lk.unlock()
		rn.held = lk
		ctx = lk.ctx
	}
	err := rn.scan(ctx, func(m kafka.Message) error {
		item := Item{Raw: m}
		d, err := Parse(m)
		switch {
		case err != nil:
			item.Action, item.Err = Unreadable, err
		case !r.cfg.Filter.Match(d):
			item.DeadLetter, item.Action = d, Skipped
		default:
			item.DeadLetter = d
			if pace != nil && !r.cfg.DryRun {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-pace:
				}
			}
			if rn.held != nil {
				if err := rn.held.check(ctx); err != nil {
					return err
				}
			}
			item.Action, item.Err, err = rn.replay(ctx, d)
			if err != nil {
				return err
			}
			if rn.dry != nil {
				rn.dry.remember(d, item.Action, r.cfg.Mode)
			}
		}
		tl.add(item)
		if r.cfg.Progress != nil {
			r.cfg.Progress(item)
		}
		return nil
	})
	if rn.held != nil {
		if cause := context.Cause(rn.held.ctx); cause != nil && rn.held.ctx.Err() != nil && !errors.Is(cause, context.Canceled) &&
			!errors.Is(cause, context.DeadlineExceeded) {
			return tl.summary(), cause // the heartbeat's: the lock lost, or an outage outlasted MaxOutage
		}
	}
	return tl.summary(), pgexec.NotMigrated(ErrNotMigrated, err)
}

// ErrReplayRunning is Run's error when another replay of the same
// dead-letter topic in the same schema, in this process or another, holds
// the topic's replay lock: two replays at once would both find a letter not
// yet replayed and both write it back. Try again once the other ended. Dry
// runs change nothing and take no lock.
var ErrReplayRunning = errors.New("dlq: a replay of this dead-letter topic is running")

// lockHeartbeat is how often a replay checks the session that holds its
// topic's lock while it runs.
const lockHeartbeat = 5 * time.Second

// ErrReplayLockLost is Run's error when the PostgreSQL session holding the
// topic's replay lock was lost during the run (the server restarted, the
// connection went silent, an administrator ended it) and another replay of
// the topic took the lock before this one could take it again: the replay
// stops rather than go on beside the other. Running it again once the other
// ended is safe: what it replayed is recognised.
var ErrReplayLockLost = errors.New("dlq: the session holding the topic's replay lock was lost")

// replayLock is a topic's replay lock, held by a PostgreSQL session of its
// own: a session advisory lock on a connection made as the pool makes its
// connections (its settings and BeforeConnect/AfterConnect hooks), so that
// the pool's connections, however few, stay free for the replay. The
// session is bounded on the server (idle_session_timeout, TCP keepalives:
// a replay whose client vanished frees the lock) and checked every
// lockHeartbeat and before each dead letter is replayed. When it is lost
// (the server restarted, the connection went silent, an administrator ended
// it) the lock is taken again, waiting out an outage; if another replay took
// it meanwhile, ctx ends with ErrReplayLockLost and the replay stops.
type replayLock struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	pool   *pgxpool.Pool
	key    int64
	topic  string
	pg     *outage.Waiter
	log    *slog.Logger
	done   chan struct{}
	mu     sync.Mutex    // conn's one user at a time
	conn   *pgxpool.Conn // nil while the lock is not held
}

// lock takes the replay lock of the run's topic, or refuses with
// ErrReplayRunning.
func (rn *run) lock(ctx context.Context) (*replayLock, error) {
	h := sha256.Sum256([]byte("idemkit-dlq-replay\x00" + rn.replays + "\x00" + rn.cfg.Topic))
	cfg := rn.cfg.pool.Config() // a copy
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 1, 0, 0
	name := "idemkit dlq replay lock"
	if app := cfg.ConnConfig.RuntimeParams["application_name"]; app != "" {
		name = app + " (" + name + ")"
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("dlq: lock the replays of %s: %w", rn.cfg.Topic, err)
	}
	l := &replayLock{pool: pool, key: int64(binary.BigEndian.Uint64(h[:8])), topic: rn.cfg.Topic, log: rn.cfg.Logger,
		done: make(chan struct{}), pg: &outage.Waiter{Op: "replay " + rn.cfg.Topic + ": postgres lock", Log: rn.cfg.Logger,
			Max: rn.cfg.MaxOutage, Bound: lockHeartbeat}}
	if err := l.take(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	l.ctx, l.cancel = context.WithCancelCause(ctx)
	go l.heartbeat()
	return l, nil
}

// take takes the lock on a new session, waiting out outages. The
// connection stays acquired until unlock: an idle one would be closed by
// the pool's health check, and the lock with it.
func (l *replayLock) take(ctx context.Context) error {
	err := l.pg.Do(ctx, func(ctx context.Context) error {
		c, err := l.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		if err := pgsession.SetSession(ctx, c.Conn(), 0, pgsession.Timeout(3*lockHeartbeat)); err != nil {
			c.Release()
			return err
		}
		var ok bool
		if err := c.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&ok); err != nil {
			c.Release()
			return err
		}
		if !ok {
			c.Release()
			return ErrReplayRunning
		}
		l.conn = c
		return nil
	})
	switch {
	case errors.Is(err, ErrReplayRunning):
		return fmt.Errorf("%w: %s", ErrReplayRunning, l.topic)
	case err != nil:
		return fmt.Errorf("dlq: lock the replays of %s: %w", l.topic, err)
	}
	return nil
}

// heartbeat checks the session every lockHeartbeat until the run ends; a
// lock it cannot take again ends the run.
func (l *replayLock) heartbeat() {
	defer close(l.done)
	t := time.NewTicker(lockHeartbeat)
	defer t.Stop()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-t.C:
			if err := l.check(l.ctx); err != nil {
				l.cancel(err)
				return
			}
		}
	}
}

// check asks the session for a sign of life, within lockHeartbeat; a
// session that gives none is closed and the lock taken again on a new one.
// It returns ErrReplayLockLost when another replay took the lock meanwhile,
// the run's end when it ended, or the outage that outlasted MaxOutage.
func (l *replayLock) check(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := context.Cause(l.ctx); err != nil {
		return err
	}
	if l.conn != nil {
		cctx, cancel := context.WithTimeout(ctx, lockHeartbeat)
		_, err := l.conn.Exec(cctx, `SELECT 1`)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l.log.Warn("dlq: the session holding the topic's replay lock was lost; taking the lock again", "topic", l.topic, "err", err)
		_ = l.conn.Conn().Close(ctx) // ends the session, if it is still there
		l.conn.Release()
		l.conn = nil
	}
	if err := l.take(ctx); err != nil {
		if errors.Is(err, ErrReplayRunning) {
			err = fmt.Errorf("%w: another replay of %s took it meanwhile; this one stopped (run it again once the other ended: what it replayed is recognised)",
				ErrReplayLockLost, l.topic)
			l.log.Error("dlq: the replay lost its topic's lock; stopping", "topic", l.topic)
		}
		return err
	}
	l.log.Info("dlq: the topic's replay lock is held again", "topic", l.topic)
	return nil
}

// unlock stops the heartbeat, unlocks, and ends the session.
func (l *replayLock) unlock() {
	l.cancel(nil)
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		// Unlocked before the session ends, so that a replay started once
		// this one returned finds the lock free; should the unlock fail,
		// closing the session still releases it (a moment later).
		ctx, cancel := context.WithTimeout(context.Background(), lockHeartbeat)
		defer cancel()
		if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, l.key); err != nil {
			l.log.Warn("dlq: unlock the replays of a topic; closing its session instead", "topic", l.topic, "err", err)
		}
		l.conn.Release()
	}
	l.pool.Close()
}

// ErrNotMigrated is wrapped by Reprocessor.Run's error when the replay
// records table (or dedup's, in Redrive mode) is missing: run migrate.Up
// with the same schema and table names. It matches idemkit.ErrNotMigrated.
var ErrNotMigrated = fmt.Errorf("dlq: table missing: %w", idemkit.ErrNotMigrated)

// scan is Scan that waits out Kafka outages and then reads on from the
// message after the last one handled, up to the end the topic had at the
// start.
func (rn *run) scan(ctx context.Context, fn func(kafka.Message) error) error {
	client, topic := rn.client, rn.cfg.Topic
	var ranges []topicscan.Range
	err := rn.kafka.Do(ctx, func(ctx context.Context) error {
		var err error
		ranges, err = topicscan.Ranges(ctx, client, topic)
		return rn.cfg.Kafka.Wrap(err)
	})
	if err != nil {
		return scanError(err, nil, topic)
	}
	for _, rg := range ranges {
		for {
			var fnErr error
			err := topicscan.Read(ctx, client, topic, rg, func(m kafka.Message) error {
				rn.kafka.Ok()
				if fnErr = fn(m); fnErr != nil {
					return fnErr
				}
				rg.First = m.Offset + 1
				return nil
			})
			if err == nil {
				break
			}
			if fnErr != nil {
				return fnErr
			}
			if werr := rn.kafka.Wait(ctx, rn.cfg.Kafka.Wrap(err)); werr != nil {
				return scanError(werr, nil, topic)
			}
		}
	}
	return nil
}

// replay handles one dead letter. It returns the action, the dead letter's
// own error, and an error that should stop the run.
func (rn *run) replay(ctx context.Context, d *DeadLetter) (Action, error, error) {
	done, err := rn.replayed(ctx, d)
	if err != nil {
		return "", nil, err
	}
	if done || rn.dry != nil && rn.dry.recorded[keyOf(d)] {
		return AlreadyReplayed, nil, nil
	}
	idErr := d.CheckID()
	if idErr == nil {
		var applied bool
		err := rn.pg.Do(ctx, func(ctx context.Context) error {
			var err error
			applied, err = rn.store.Processed(ctx, rn.cfg.pool, d.Consumer, d.MessageID)
			return err
		})
		if err != nil {
			return "", nil, fmt.Errorf("dlq: check dedup for %s: %w", d.MessageID, err)
		}
		if rn.dry != nil && rn.dry.claimed[claimKey{d.Consumer, d.MessageID}] {
			applied = true
		}
		if applied {
			if rn.cfg.DryRun {
				return AlreadyApplied, nil, nil
			}
			return AlreadyApplied, nil, rn.record(ctx, d, AlreadyApplied, "")
		}
	}
	if d.Round >= rn.cfg.ReplayLimit {
		// Its last round failed (in Republish mode, in the consumer).
		perr := fmt.Errorf("%w after %d round(s): %s", ErrReplayLimit, d.Round, d.Last().Error)
		if rn.cfg.DryRun {
			return Exhausted, perr, nil
		}
		return Exhausted, perr, rn.record(ctx, d, Exhausted, d.Last().Error)
	}
	if idErr == nil {
		if herr := rn.beyondHorizon(d, time.Now()); herr != nil {
			return BeyondHorizon, herr, nil
		}
	}
	switch {
	case idErr != nil && rn.cfg.Mode == Redrive:
		// Without an ID nothing can be claimed in the consumer's scope:
		// left alone (not recorded), for a Republish run to take.
		return NoMessageID, idErr, nil
	case rn.cfg.DryRun:
		return WouldReplay, nil, nil
	}
	err = rn.pg.Do(ctx, func(ctx context.Context) error { return rn.back.values.load(ctx, rn.cfg.pool, d) })
	switch {
	case errors.Is(err, ErrValueNotFound):
		return ValueNotFound, err, nil
	case err != nil:
		return "", nil, err
	case rn.cfg.Mode == Republish:
		m := republishable(d)
		src := source{topic: d.Message.Topic, partition: d.Message.Partition, offset: d.Message.Offset, id: d.MessageID}
		err := rn.back.write(ctx, d.Origin.Topic, src, rn.kafka, func(context.Context) (kafka.Message, error) { return m, nil })
		if err != nil {
			return rn.writeFailed(ctx, d, err)
		}
		action := Republished
		if idErr != nil {
			action = RepublishedNoID
		}
		return action, idErr, rn.record(ctx, d, action, "")
	}
	return rn.redrive(ctx, d)
}

// beyondHorizon returns the *consumer.HorizonError of a dead letter whose
// original message is older than the horizon of Retention, by now; nil when
// Retention is not set, the operator opted in, or the message had no
// timestamp. The caller found no dedup record for its ID.
func (rn *run) beyondHorizon(d *DeadLetter, now time.Time) *consumer.HorizonError {
	ret := rn.cfg.Retention
	if ret <= 0 || rn.cfg.OnBeyondHorizon == consumer.HorizonApply || d.Origin.Time.IsZero() {
		return nil
	}
	horizon := ret - min(ret/10, consumer.HorizonMarginMax) // the consumer's default margin
	if age := now.Sub(d.Origin.Time); age > horizon {
		return &consumer.HorizonError{Time: d.Origin.Time, Age: age, Horizon: horizon}
	}
	return nil
}

// republishable is the original message, bound for its origin topic, with
// its lineage.
//
// A letter whose ID the consumer derived (MissingIDUseCoordinates: the
// original has no "message-id" header) goes back with that ID in the
// header, so that the copy is deduplicated under the ID the first attempt
// had: a crash between the republish and its record, then a rerun, does not
// apply it twice.
func republishable(d *DeadLetter) kafka.Message {
	m := d.Original()
	m.Topic, m.Partition, m.Offset = d.Origin.Topic, 0, 0
	lin, _ := json.Marshal(lineage{Origin: d.Origin, Consumer: d.Consumer, History: d.History})
	m.Headers = append(m.Headers, kafka.Header{Key: HeaderLineage, Value: lin})
	if d.MessageID != "" && !slices.ContainsFunc(m.Headers, func(h kafka.Header) bool { return h.Key == consumer.IDHeaderDefault }) {
		m.Headers = append(m.Headers, kafka.Header{Key: consumer.IDHeaderDefault, Value: []byte(d.MessageID)})
	}
	return m
}

// connLostError is a redrive transaction whose connection died under the
// handler: an outage (it matches net.ErrClosed), whatever the handler made
// of it.
type connLostError struct{ handlerErr error }

func (e *connLostError) Error() string {
	return "connection lost under the handler: " + e.handlerErr.Error()
}

func (e *connLostError) Unwrap() []error { return []error{net.ErrClosed, e.handlerErr} }

func (rn *run) redrive(ctx context.Context, d *DeadLetter) (Action, error, error) {
	msg := &consumer.Message{Message: d.Original(), ID: d.MessageID, Incarnation: d.Origin.Incarnation}
	schedule := rn.cfg.Retry.Schedule()
	first := time.Now()
	attempts := 0
	var herr error
	var class retry.Class
	conflicts := 0
	for {
		action, err := rn.redriveTx(ctx, d, msg)
		if err == nil {
			rn.pg.Ok()
			return action, nil, nil
		}
		var hf *handlerFailure
		switch {
		case errors.As(err, &hf):
		case errors.Is(err, dedup.ErrPartitionDropped):
			// Its claim cannot be recorded any more (the daily layout's
			// retention dropped its ID's day): redriving it could apply it
			// twice. Left in the dead-letter topic, recorded, the run goes on.
			rn.pg.Ok()
			return BeyondHorizon, err, rn.record(ctx, d, BeyondHorizon, err.Error())
		case errors.Is(err, dedup.ErrNoPartition):
			hf = &handlerFailure{err} // no partition yet: retried as a transient failure
		case (conflict(err) || errors.Is(err, dedup.ErrLayoutChanged)) && conflicts < maxConflicts:
			conflicts++ // a serialization failure, a deadlock, a layout read again: run the transaction again
			continue
		default:
			if werr := rn.pg.Wait(ctx, err); werr != nil {
				if ctx.Err() != nil {
					return "", nil, ctx.Err()
				}
				return "", nil, fmt.Errorf("dlq: redrive %s: %w", d.MessageID, werr)
			}
			continue // an outage: the same attempt again
		}
		rn.pg.Ok()
		attempts++
		herr = hf.err
		class = rn.cfg.Retry.Classify(herr)
		if class == retry.ClassStop {
			if ctx.Err() != nil {
				return "", nil, ctx.Err()
			}
			class = retry.ClassTransient // the handler's own timeout
		}
		var delay time.Duration
		ok := false
		if class == retry.ClassTransient {
			delay, ok = schedule.Next()
		}
		if !ok {
			break
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", nil, ctx.Err()
		case <-t.C:
		}
	}
	// The handler failed again: extend the history, and either send the
	// message around once more or, in its last round, exhaust it.
	f := Failure{Error: pgtext.Text(herr.Error(), maxErrorText), Class: class.String(), Attempts: attempts,
		FirstFailure: first.UTC(), LastFailure: time.Now().UTC()}
	if d.Round+1 >= rn.cfg.ReplayLimit {
		return Exhausted, herr, rn.record(ctx, d, Exhausted, f.Error)
	}
	next := &letter{topic: rn.destination(msg, herr, class, f), orig: d.Message, origin: d.Origin, group: d.Group, name: d.Consumer,
		id: d.MessageID, history: extend(d.History, f),
		src: source{topic: d.Message.Topic, partition: d.Message.Partition, offset: d.Message.Offset, id: d.MessageID}}
	if err := rn.back.writeLetter(ctx, next, rn.kafka, rn.pg); err != nil {
		return rn.writeFailed(ctx, d, fmt.Errorf("%w (the handler failed again: %v)", err, herr))
	}
	return FailedAgain, herr, rn.record(ctx, d, FailedAgain, f.Error)
}

// writeFailed makes a failed write of d (back to the dead-letter topic, or
// to its origin) d's WriteFailed, recorded, unless the run must end: ctx
// ended, an outage outlasted MaxOutage, or the brokers refused the
// credentials (every letter would fail alike).
func (rn *run) writeFailed(ctx context.Context, d *DeadLetter, err error) (Action, error, error) {
	if ctx.Err() != nil || errors.Is(err, retry.ErrOutage) || errors.Is(err, kafkaconn.ErrAuthentication) ||
		errors.Is(err, kafkaconn.ErrTLS) {
		return "", nil, err
	}
	m := d.Message
	err = fmt.Errorf("dead letter %s/%d/%d (message %q from %s/%d/%d): %w", m.Topic, m.Partition, m.Offset,
		d.MessageID, d.Origin.Topic, d.Origin.Partition, d.Origin.Offset, err)
	return WriteFailed, err, rn.record(ctx, d, WriteFailed, err.Error())
}

// destination is the dead-letter topic of msg, which failed again with
// herr (f): Destination's choice, or Topic.
func (rn *run) destination(msg *consumer.Message, herr error, class retry.Class, f Failure) string {
	if rn.cfg.Destination == nil {
		return rn.cfg.Topic
	}
	merr := &consumer.MessageError{Topic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, ID: msg.ID,
		Attempts: f.Attempts, Class: class, FirstFailure: f.FirstFailure, LastFailure: f.LastFailure, Err: herr}
	return cmp.Or(rn.cfg.Destination(msg, merr), rn.cfg.Topic)
}

// redriveTx is one attempt: a transaction that records the replay, claims
// the message ID, runs the handler and commits. A handler error comes back
// as a *handlerFailure; any other error is the database's.
//
// The transaction is bounded (see HandlerTimeout): the server ends it when
// it sits idle longer than the handler may take, and its statements give
// up on a silent connection after as long.
func (rn *run) redriveTx(ctx context.Context, d *DeadLetter, msg *consumer.Message) (_ Action, err error) {
	ctx, cancel := context.WithTimeout(ctx, pgsession.Timeout(rn.cfg.HandlerTimeout))
	defer cancel()
	tx, err := rn.cfg.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: pgsession.BeginQuery("", rn.cfg.HandlerTimeout)})
	if err != nil {
		return "", fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if retry.IsReadOnly(err) {
			// A session made read-only (SET SESSION CHARACTERISTICS) stays
			// so: close it before the rollback gives it back to the pool.
			_ = tx.Conn().Close(context.WithoutCancel(ctx))
		}
		// Bounded: the connection may have gone silent.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pgsession.Margin)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	// The replay record first: a concurrent or repeated replay of the same
	// dead letter waits here, then finds it and does nothing.
	tag, err := tx.Exec(ctx, `INSERT INTO `+rn.replays+` AS r (origin_topic, origin_incarnation, origin_partition,
		origin_offset, replay_round, dead_letter_topic, message_id, consumer, outcome, replayed_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) `+replaceWriteFailed,
		d.Origin.Topic, d.Origin.Incarnation, d.Origin.Partition, d.Origin.Offset, d.Round,
		rn.cfg.Topic, d.MessageID, d.Consumer, string(Applied), rn.cfg.ReplayedBy)
	if err != nil {
		return "", fmt.Errorf("record replay: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return AlreadyReplayed, nil
	}
	dup, err := rn.store.ClaimTx(ctx, tx, dedup.Claim{Consumer: d.Consumer, MessageID: d.MessageID,
		Topic: d.Origin.Topic, Partition: d.Origin.Partition, Offset: d.Origin.Offset})
	if err != nil {
		return "", err
	}
	action := Applied
	if dup {
		action = AlreadyApplied
		if _, err := tx.Exec(ctx, `UPDATE `+rn.replays+` SET outcome = $6 WHERE origin_topic = $1
			AND origin_incarnation = $2 AND origin_partition = $3 AND origin_offset = $4 AND replay_round = $5`,
			d.Origin.Topic, d.Origin.Incarnation, d.Origin.Partition, d.Origin.Offset, d.Round,
			string(AlreadyApplied)); err != nil {
			return "", err
		}
	} else if outOfTime, err := rn.callHandler(ctx, tx, msg); err != nil {
		if tx.Conn().IsClosed() && !outOfTime {
			return "", &connLostError{err}
		}
		// A handler that ran out of its time failed, also when pgx closed
		// the connection under its statement at that deadline.
		return "", &handlerFailure{err}
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	return action, nil
}

// maxConflicts bounds how often one redrive transaction runs again after a
// serialization failure or a deadlock, as the consumer bounds its own.
const maxConflicts = 10

// conflict reports a serialization failure or a deadlock.
func conflict(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

type handlerFailure struct{ err error }

func (h *handlerFailure) Error() string { return h.err.Error() }
func (h *handlerFailure) Unwrap() error { return h.err }

// callHandler runs the handler within HandlerTimeout; outOfTime says that
// its deadline passed.
func (rn *run) callHandler(ctx context.Context, tx pgx.Tx, m *consumer.Message) (outOfTime bool, err error) {
	hctx, cancel := context.WithTimeout(ctx, rn.cfg.HandlerTimeout)
	defer cancel()
	err = callHandler(hctx, rn.cfg.Handler, tx, m)
	return hctx.Err() != nil && ctx.Err() == nil, err
}

func callHandler(ctx context.Context, h consumer.Handler, tx pgx.Tx, m *consumer.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = idemkit.NewPanicError("dlq: handler", v)
		}
	}()
	return h.Handle(ctx, tx, m)
}

// replayed reports whether this dead letter (this round) has a replay
// record; a WriteFailed record does not count: its letter is tried again.
func (rn *run) replayed(ctx context.Context, d *DeadLetter) (bool, error) {
	var done bool
	err := rn.pg.Do(ctx, func(ctx context.Context) error {
		return rn.cfg.pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+rn.replays+` WHERE origin_topic = $1
			AND origin_incarnation = $2 AND origin_partition = $3 AND origin_offset = $4 AND replay_round = $5
			AND outcome <> $6)`,
			d.Origin.Topic, d.Origin.Incarnation, d.Origin.Partition, d.Origin.Offset, d.Round,
			string(WriteFailed)).Scan(&done)
	})
	if err != nil {
		return false, fmt.Errorf("dlq: read replay records: %w", err)
	}
	return done, nil
}

// record writes the replay record of a dead letter that was not redriven.
// Its texts come from the dead letter's headers, which may hold anything: a
// message ID CheckID rejects is recorded as empty (a letter without ID), and
// the consumer and the detail are made storable, so that a letter already
// republished is always recorded and never republished again.
func (rn *run) record(ctx context.Context, d *DeadLetter, a Action, detail string) error {
	id := d.MessageID
	if d.CheckID() != nil {
		id = ""
	}
	name, detail := pgtext.Text(d.Consumer, 0), pgtext.Text(detail, maxErrorText)
	err := rn.pg.Do(ctx, func(ctx context.Context) error {
		_, err := rn.cfg.pool.Exec(ctx, `INSERT INTO `+rn.replays+` AS r (origin_topic, origin_incarnation,
			origin_partition, origin_offset, replay_round, dead_letter_topic, message_id, consumer, outcome, detail,
			replayed_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULLIF($10, ''), $11) `+replaceWriteFailed,
			d.Origin.Topic, d.Origin.Incarnation, d.Origin.Partition, d.Origin.Offset, d.Round, rn.cfg.Topic,
			id, name, string(a), detail, rn.cfg.ReplayedBy)
		return err
	})
	if err != nil {
		return fmt.Errorf("dlq: record replay of %s/%d/%d: %w", d.Origin.Topic, d.Origin.Partition, d.Origin.Offset, err)
	}
	return nil
}

// replaceWriteFailed ends the inserts of replay records: a record that
// exists is kept, unless it says that the letter's write failed (a later
// run tried it again): then the new record replaces it.
const replaceWriteFailed = `ON CONFLICT (origin_topic, origin_incarnation, origin_partition, origin_offset, replay_round)
	DO UPDATE SET dead_letter_topic = EXCLUDED.dead_letter_topic, message_id = EXCLUDED.message_id,
		consumer = EXCLUDED.consumer, outcome = EXCLUDED.outcome, detail = EXCLUDED.detail,
		replayed_by = EXCLUDED.replayed_by, replayed_at = now()
	WHERE r.outcome = '` + string(WriteFailed) + `'`
