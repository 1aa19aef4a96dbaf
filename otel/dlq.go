package idemotel

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
// "applied", "already-applied", "republished", "failed-again", "exhausted", …).
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

// DeadLetterTopics observes the state of dead-letter topics; see
// Telemetry.ObserveDeadLetters.
type DeadLetterTopics struct {
	t     *Telemetry
	pool  *pgxpool.Pool
	cfg   dlq.ListConfig
	attrs map[string]map[dlq.State]attrOpts // per topic and state

	mu     sync.Mutex // one read at a time, whatever the scrapes
	at     time.Time  // when the last answer (or failure) came
	ok     bool       // the last read succeeded
	counts map[string]map[dlq.State]int
	reg    metric.Registration
}

// deadLetterStates are the states the gauge reports, each observed (0 when
// no message is in it) so that an alert compares with 0, not with nothing.
var deadLetterStates = []dlq.State{dlq.StateUnresolved, dlq.StateReplayed, dlq.StateApplied, dlq.StateExhausted,
	dlq.StateSuperseded, dlq.StateBeyondHorizon}

// ObserveDeadLetters registers the gauge idemkit_dlq_messages{dlq_topic,state}:
// the origin messages of the dead-letter topics cfg.Topics per state (see
// dlq.State; a message dead-lettered twice, or in several rounds, counts
// once, in the topic of its latest round: see dlq.Listing.CountByTopic),
// every topic and state observed. List every destination of a dlq.Writer
// with Routes (Writer.Topics) in one call, so that a message whose rounds
// went to several of them counts once. Alert on state="unresolved": the
// messages no replay decided, which a topic's depth does not tell (it keeps
// the replayed ones). At each collection it reads the topics and the replay
// records in pool with dlq.List (without payloads) when its last answer is
// older than Config.QueryInterval, bounded by Config.QueryTimeout (topics
// of many dead letters need a longer one); a read that fails leaves the
// gauge out until the next read and is reported to otel.Handle. Close
// unregisters the gauge.
func (t *Telemetry) ObserveDeadLetters(pool *pgxpool.Pool, cfg *dlq.ListConfig) (*DeadLetterTopics, error) {
	switch {
	case pool == nil:
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	case cfg == nil || len(cfg.Topics) == 0:
		return nil, fmt.Errorf("%w: dead-letter topics are needed", ErrInvalidConfig)
	}
	d := &DeadLetterTopics{t: t, pool: pool, cfg: *cfg, attrs: map[string]map[dlq.State]attrOpts{}}
	d.cfg.Topics = slices.Clone(cfg.Topics)
	d.cfg.NoPayload, d.cfg.Filter = true, dlq.Filter{}
	for _, topic := range d.cfg.Topics {
		d.attrs[topic] = map[dlq.State]attrOpts{}
		for _, s := range deadLetterStates {
			d.attrs[topic][s] = attrs(keyDLQTopic, topic, keyState, string(s))
		}
	}
	reg, err := t.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if counts, ok := d.read(ctx); ok {
			for _, topic := range d.cfg.Topics {
				for _, s := range deadLetterStates {
					o.ObserveInt64(t.dlq.messages, int64(counts[topic][s]), d.attrs[topic][s].obs...)
				}
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

// read returns the counts per topic and state, read again when the last
// read is older than QueryInterval; false when the last read failed.
func (d *DeadLetterTopics) read(ctx context.Context) (map[string]map[dlq.State]int, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.at.IsZero() || time.Since(d.at) >= d.t.cfg.QueryInterval {
		qctx, cancel := context.WithTimeout(ctx, d.t.cfg.QueryTimeout)
		l, err := dlq.List(qctx, d.pool, &d.cfg)
		cancel()
		d.at, d.ok = time.Now(), err == nil
		if err != nil {
			otel.Handle(fmt.Errorf("idemotel: read dead-letter topics %s: %w", strings.Join(d.cfg.Topics, ", "), err))
			return nil, false
		}
		d.counts = l.CountByTopic()
	}
	return d.counts, d.ok
}

// Close unregisters the gauge.
func (d *DeadLetterTopics) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.reg == nil {
		return nil
	}
	err := d.reg.Unregister()
	d.reg = nil
	return err
}
