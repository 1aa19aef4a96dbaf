package idemotel

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/idemkit/idemkit/dlq"
)

// Reprocessor wires the telemetry into cfg before dlq.NewReprocessor(pool, cfg):
// it chains cfg.Progress (the function cfg already had runs after) so that
// each dead letter handled counts into idemkit_dlq_replayed_total, labelled
// with the dead-letter topic (cfg.Topic) and what was done (the dlq.Action:
// "applied", "already-applied", "republished", "failed-again", "parked", …).
func (t *Telemetry) Reprocessor(cfg *dlq.ReprocessorConfig) error {
	if cfg == nil {
		return fmt.Errorf("%w: nil reprocessor config", ErrInvalidConfig)
	}
	topic := cfg.Topic
	var mu sync.Mutex
	byAction := map[dlq.Action]attrOpts{}
	prev := cfg.Progress
	cfg.Progress = func(item dlq.Item) {
		mu.Lock()
		opts, ok := byAction[item.Action]
		if !ok {
			opts = attrs(keyDLQTopic, topic, keyOutcome, string(item.Action))
			byAction[item.Action] = opts
		}
		mu.Unlock()
		t.dlq.replayed.Add(context.Background(), 1, opts.add...)
		if prev != nil {
			prev(item)
		}
	}
	return nil
}

// DeadLetterTopic observes the state of one dead-letter topic; see
// Telemetry.ObserveDeadLetters.
type DeadLetterTopic struct {
	t     *Telemetry
	pool  *pgxpool.Pool
	cfg   dlq.ListConfig
	attrs map[dlq.State]attrOpts

	mu     sync.Mutex // one read at a time, whatever the scrapes
	at     time.Time  // when the last answer (or failure) came
	ok     bool       // the last read succeeded
	counts map[dlq.State]int
	reg    metric.Registration
}

// deadLetterStates are the states the gauge reports, each observed (0 when
// no message is in it) so that an alert compares with 0, not with nothing.
var deadLetterStates = []dlq.State{dlq.StateUnresolved, dlq.StateReplayed, dlq.StateApplied, dlq.StateExhausted,
	dlq.StateSuperseded, dlq.StateBeyondHorizon}

// ObserveDeadLetters registers the gauge idemkit_dlq_messages{dlq_topic,state}:
// the origin messages of the dead-letter topic cfg.Topic per state (see
// dlq.State; a message dead-lettered twice, or in several rounds, counts
// once), every state observed. Alert on state="unresolved": the messages
// no replay decided, which a topic's depth does not tell (it keeps the
// replayed ones). At each collection it reads the topic and the replay
// records in pool with dlq.List (without payloads) when its last answer is
// older than Config.QueryInterval, bounded by Config.QueryTimeout (a topic
// of many dead letters needs a longer one); a read that fails leaves the
// gauge out until the next read and is reported to otel.Handle. Close
// unregisters the gauge.
func (t *Telemetry) ObserveDeadLetters(pool *pgxpool.Pool, cfg *dlq.ListConfig) (*DeadLetterTopic, error) {
	switch {
	case pool == nil:
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	case cfg == nil || cfg.Topic == "":
		return nil, fmt.Errorf("%w: a dead-letter topic is needed", ErrInvalidConfig)
	}
	d := &DeadLetterTopic{t: t, pool: pool, cfg: *cfg, attrs: map[dlq.State]attrOpts{}}
	d.cfg.NoPayload, d.cfg.Filter = true, dlq.Filter{}
	for _, s := range deadLetterStates {
		d.attrs[s] = attrs(keyDLQTopic, cfg.Topic, keyState, string(s))
	}
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if counts, ok := d.read(ctx); ok {
			for _, s := range deadLetterStates {
				o.ObserveInt64(t.dlq.messages, int64(counts[s]), d.attrs[s].obs...)
			}
		}
		return nil
	}, t.dlq.messages)
	if err != nil {
		return nil, fmt.Errorf("idemotel: register the dead-letter gauge: %w", err)
	}
	d.reg = reg
	return d, nil
}

// read returns the counts per state, read again when the last read is
// older than QueryInterval; false when the last read failed.
func (d *DeadLetterTopic) read(ctx context.Context) (map[dlq.State]int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at.IsZero() || time.Since(d.at) >= d.t.cfg.QueryInterval {
		qctx, cancel := context.WithTimeout(ctx, d.t.cfg.QueryTimeout)
		l, err := dlq.List(qctx, d.pool, &d.cfg)
		cancel()
		d.at, d.ok = time.Now(), err == nil
		if err != nil {
			otel.Handle(fmt.Errorf("idemotel: read dead-letter topic %s: %w", d.cfg.Topic, err))
			return nil, false
		}
		d.counts = l.Count()
	}
	return d.counts, d.ok
}

// Close unregisters the gauge.
func (d *DeadLetterTopic) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.reg == nil {
		return nil
	}
	err := d.reg.Unregister()
	d.reg = nil
	return err
}
