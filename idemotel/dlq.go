package idemotel

import (
	"context"
	"fmt"
	"sync"

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
