package dlq

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/outage"
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
	FailedAgain     Action = "failed-again"      // failed again: back to the dead-letter topic, history extended
	Parked          Action = "parked"            // its replay rounds are used up: recorded, not replayed again
	NoMessageID     Action = "no-message-id"     // Redrive: no usable message ID, so no dedup: left alone
	Skipped         Action = "skipped"           // not selected by the filter
	WouldReplay     Action = "would-replay"      // dry run: would be replayed
	Unreadable      Action = "unreadable"        // not an idemkit dead letter
)

// ErrReplayLimit is the Err of an Item parked because its dead letter had
// used up its replay rounds before this run.
var ErrReplayLimit = errors.New("dlq: replay limit reached")

// Defaults of ReprocessorConfig.
const (
	ReplayLimitDefault = 3
)

// ReprocessorConfig configures a Reprocessor. Brokers, Topic, Mode and Pool
// are required, and Handler in Redrive mode.
type ReprocessorConfig struct {
	// Brokers are the Kafka bootstrap addresses.
	Brokers []string
	// Topic is the dead-letter topic to replay.
	Topic string
	// Mode is Redrive or Republish.
	Mode Mode
	// Handler re-runs a message in Redrive mode: the consumer's handler.
	Handler consumer.Handler

	// Pool is where dedup records and replay records live.
	Pool *pgxpool.Pool
	// Tables names the schema and tables (see package migrate, versions 4
	// and 7). Defaults to migrate's defaults.
	Tables migrate.Config

	// Filter selects which dead letters to replay.
	Filter Filter
	// DryRun lists what would be done and changes nothing.
	DryRun bool
	// Rate bounds replays per second. Defaults to 0: no bound.
	Rate float64
	// ReplayLimit is how many replay rounds a dead letter gets. One that
	// fails again in its last round is parked (recorded, not written back)
	// in Redrive mode; in Republish mode the consumer dead-letters it once
	// more, and the next run parks that dead letter. Defaults to 3.
	ReplayLimit int
	// ReplayedBy is recorded as who replayed. Defaults to user@host.
	ReplayedBy string
	// Retry paces the handler's attempts within one replay and the writes
	// to Kafka. Defaults to the zero retry.Policy.
	Retry *retry.Policy
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
	// Parked, ErrReplayLimit for a dead letter parked without a new round,
	// ErrNoMessageID for NoMessageID and RepublishedNoID, ErrNotDeadLetter for
	// Unreadable.
	Err error
}

// Summary counts actions.
type Summary map[Action]int

// Reprocessor replays a dead-letter topic once, from its start to the end it
// has when Run starts.
type Reprocessor struct {
	cfg     ReprocessorConfig
	store   *dedup.Store
	replays string // quoted table
	pub     *kafka.Writer
	back    *Writer
}

// NewReprocessor validates cfg and returns a Reprocessor. Close it when done.
func NewReprocessor(cfg *ReprocessorConfig) (*Reprocessor, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	c := *cfg
	invalid := func(msg string) error { return fmt.Errorf("%w: %s", ErrInvalidConfig, msg) }
	switch {
	case len(c.Brokers) == 0:
		return nil, invalid("Brokers is empty")
	case c.Topic == "":
		return nil, invalid("Topic is empty")
	case c.Pool == nil:
		return nil, invalid("Pool is nil")
	case c.Mode != Redrive && c.Mode != Republish:
		return nil, invalid("Mode must be Redrive or Republish")
	case c.Mode == Redrive && c.Handler == nil:
		return nil, invalid("Redrive needs a Handler")
	case c.Rate < 0:
		return nil, invalid("Rate must not be negative")
	case c.ReplayLimit < 0:
		return nil, invalid("ReplayLimit must not be negative")
	}
	c.ReplayLimit = cmp.Or(c.ReplayLimit, ReplayLimitDefault)
	c.ReplayedBy = cmp.Or(c.ReplayedBy, whoami())
	if c.Retry == nil {
		c.Retry = &retry.Policy{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	tables := c.Tables.WithDefaults()
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	store, err := dedup.New(&dedup.Config{Schema: tables.Schema, Tables: tables.Tables})
	if err != nil {
		return nil, err
	}
	back, err := NewWriter(&WriterConfig{Brokers: c.Brokers, Topic: c.Topic, Retry: c.Retry, Logger: c.Logger})
	if err != nil {
		return nil, err
	}
	return &Reprocessor{cfg: c, store: store, back: back,
		replays: pgx.Identifier{tables.Schema, tables.Tables.DLQReplays}.Sanitize(),
		pub: &kafka.Writer{Addr: kafka.TCP(c.Brokers...), Balancer: &kafka.Hash{},
			RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}}, nil
}

// Close releases the Kafka writers.
func (r *Reprocessor) Close() error { return errors.Join(r.pub.Close(), r.back.Close()) }

func whoami() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + cmp.Or(host, "unknown")
}

// Run replays every selected dead letter once and returns what it did. A
// dead letter's own trouble (no message ID, a handler that fails again) is
// that dead letter's Action, never the end of the run. It stops at the first
// error it cannot attribute to one dead letter (Kafka or PostgreSQL
// unreachable); running it again is safe: dead letters already replayed are
// recognised and left alone.
func (r *Reprocessor) Run(ctx context.Context) (Summary, error) {
	sum := Summary{}
	var pace <-chan time.Time
	if r.cfg.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / r.cfg.Rate))
		defer t.Stop()
		pace = t.C
	}
	err := Scan(ctx, r.cfg.Brokers, r.cfg.Topic, func(m kafka.Message) error {
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
			item.Action, item.Err, err = r.replay(ctx, d)
			if err != nil {
				return err
			}
		}
		sum[item.Action]++
		if r.cfg.Progress != nil {
			r.cfg.Progress(item)
		}
		return nil
	})
	return sum, err
}

// replay handles one dead letter. It returns the action, the dead letter's
// own error, and an error that should stop the run.
func (r *Reprocessor) replay(ctx context.Context, d *DeadLetter) (Action, error, error) {
	done, err := r.replayed(ctx, d)
	if err != nil {
		return "", nil, err
	}
	if done {
		return AlreadyReplayed, nil, nil
	}
	idErr := d.CheckID()
	if idErr == nil {
		applied, err := r.store.Processed(ctx, r.cfg.Pool, d.Consumer, d.MessageID)
		if err != nil {
			return "", nil, fmt.Errorf("dlq: check dedup for %s: %w", d.MessageID, err)
		}
		if applied {
			if r.cfg.DryRun {
				return AlreadyApplied, nil, nil
			}
			return AlreadyApplied, nil, r.record(ctx, r.cfg.Pool, d, AlreadyApplied, "")
		}
	}
	if d.Round >= r.cfg.ReplayLimit {
		// Its last round failed (in Republish mode, in the consumer).
		perr := fmt.Errorf("%w after %d round(s): %s", ErrReplayLimit, d.Round, d.Last().Error)
		if r.cfg.DryRun {
			return Parked, perr, nil
		}
		return Parked, perr, r.record(ctx, r.cfg.Pool, d, Parked, d.Last().Error)
	}
	switch {
	case idErr != nil && r.cfg.Mode == Redrive:
		// Without an ID nothing can be claimed in the consumer's scope:
		// left alone (not recorded), for a Republish run to take.
		return NoMessageID, idErr, nil
	case r.cfg.DryRun:
		return WouldReplay, nil, nil
	case r.cfg.Mode == Republish:
		if err := r.back.write(ctx, republishable(d), r.outage()); err != nil {
			return "", nil, err
		}
		action := Republished
		if idErr != nil {
			action = RepublishedNoID
		}
		return action, idErr, r.record(ctx, r.cfg.Pool, d, action, "")
	}
	return r.redrive(ctx, d)
}

// republishable is the original message, bound for its origin topic, with
// its lineage.
func republishable(d *DeadLetter) kafka.Message {
	m := d.Original()
	m.Topic, m.Partition, m.Offset = d.Origin.Topic, 0, 0
	lin, _ := json.Marshal(lineage{Origin: d.Origin, Consumer: d.Consumer, History: d.History})
	m.Headers = append(m.Headers, kafka.Header{Key: HeaderLineage, Value: lin})
	return m
}

func (r *Reprocessor) redrive(ctx context.Context, d *DeadLetter) (Action, error, error) {
	orig := d.Original()
	msg := &consumer.Message{Message: orig, ID: d.MessageID, Incarnation: d.Origin.Incarnation}
	var action Action
	first := time.Now()
	attempts := 0
	err := r.cfg.Retry.Do(ctx, func(ctx context.Context) error {
		attempts++
		tx, err := r.cfg.Pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		// The replay record first: a concurrent or repeated replay of the same
		// dead letter waits here, then finds it and does nothing.
		tag, err := tx.Exec(ctx, `INSERT INTO `+r.replays+` (origin_topic, origin_incarnation, origin_partition,
			origin_offset, replay_round, dead_letter_topic, message_id, consumer, outcome, replayed_by)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT DO NOTHING`,
			d.Origin.Topic, d.Origin.Incarnation, d.Origin.Partition, d.Origin.Offset, d.Round,
			r.cfg.Topic, d.MessageID, d.Consumer, string(Applied), r.cfg.ReplayedBy)
		if err != nil {
			return fmt.Errorf("record replay: %w", err)
		}
		if tag.RowsAffected() == 0 {
			action = AlreadyReplayed
			return nil
		}
		dup, err := r.store.ClaimTx(ctx, tx, dedup.Claim{Consumer: d.Consumer, MessageID: d.MessageID,
			Topic: d.Origin.Topic, Partition: d.Origin.Partition, Offset: d.Origin.Offset})
		if err != nil {
			return retry.Permanent(err) // invalid IDs cannot heal
		}
		action = Applied
		if dup {
			action = AlreadyApplied
			if _, err := tx.Exec(ctx, `UPDATE `+r.replays+` SET outcome = $6 WHERE origin_topic = $1
				AND origin_incarnation = $2 AND origin_partition = $3 AND origin_offset = $4 AND replay_round = $5`,
				d.Origin.Topic, d.Origin.Incarnation, d.Origin.Partition, d.Origin.Offset, d.Round,
				string(AlreadyApplied)); err != nil {
				return err
			}
		} else if err := callHandler(ctx, r.cfg.Handler, tx, msg); err != nil {
			return &handlerFailure{err}
		}
		return tx.Commit(ctx)
	}, nil)
	if err == nil {
		return action, nil, nil
	}
	var hf *handlerFailure
	if !errors.As(err, &hf) {
		if ctx.Err() != nil {
			return "", nil, ctx.Err()
		}
		return "", nil, fmt.Errorf("dlq: redrive %s: %w", d.MessageID, err)
	}
	// The handler failed again: extend the history, and either send the
	// message around once more or, in its last round, park it.
	var rerr *retry.Error
	class := retry.ClassTransient
	if errors.As(err, &rerr) {
		class = rerr.Class
	}
	f := Failure{Error: truncate(hf.err.Error()), Class: class.String(), Attempts: attempts,
		FirstFailure: first.UTC(), LastFailure: time.Now().UTC()}
	if d.Round+1 >= r.cfg.ReplayLimit {
		return Parked, hf.err, r.record(ctx, r.cfg.Pool, d, Parked, f.Error)
	}
	next := build(d.Message, d.Origin, d.Group, d.Consumer, d.MessageID, d.History, f)
	next.Topic = r.cfg.Topic
	if err := r.back.write(ctx, next, r.outage()); err != nil {
		return "", nil, err
	}
	return FailedAgain, hf.err, r.record(ctx, r.cfg.Pool, d, FailedAgain, f.Error)
}

// outage is the Kafka outage of one write: none bounds it yet.
func (r *Reprocessor) outage() *outage.Waiter {
	return &outage.Waiter{Op: "replay " + r.cfg.Topic + ": kafka", Log: r.cfg.Logger}
}

type handlerFailure struct{ err error }

func (h *handlerFailure) Error() string { return h.err.Error() }
func (h *handlerFailure) Unwrap() error { return h.err }

func callHandler(ctx context.Context, h consumer.Handler, tx pgx.Tx, m *consumer.Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("handler panicked: %v", v)
		}
	}()
	return h.Handle(ctx, tx, m)
}

// replayed reports whether this dead letter (this round) has a replay record.
func (r *Reprocessor) replayed(ctx context.Context, d *DeadLetter) (bool, error) {
	var done bool
	err := r.cfg.Pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+r.replays+` WHERE origin_topic = $1
		AND origin_incarnation = $2 AND origin_partition = $3 AND origin_offset = $4 AND replay_round = $5)`,
		d.Origin.Topic, d.Origin.Incarnation, d.Origin.Partition, d.Origin.Offset, d.Round).Scan(&done)
	if err != nil {
		return false, fmt.Errorf("dlq: read replay records: %w", err)
	}
	return done, nil
}

func (r *Reprocessor) record(ctx context.Context, db dedup.DBTX, d *DeadLetter, a Action, detail string) error {
	_, err := db.Exec(ctx, `INSERT INTO `+r.replays+` (origin_topic, origin_incarnation, origin_partition,
		origin_offset, replay_round, dead_letter_topic, message_id, consumer, outcome, detail, replayed_by)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, NULLIF($10, ''), $11) ON CONFLICT DO NOTHING`,
		d.Origin.Topic, d.Origin.Incarnation, d.Origin.Partition, d.Origin.Offset, d.Round, r.cfg.Topic,
		d.MessageID, d.Consumer, string(a), detail, r.cfg.ReplayedBy)
	if err != nil {
		return fmt.Errorf("dlq: record replay of %s/%d/%d: %w", d.Origin.Topic, d.Origin.Partition, d.Origin.Offset, err)
	}
	return nil
}
