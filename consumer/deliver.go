package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/segmentio/kafka-go"
)

// ErrDeliverInput is wrapped by the errors Deliver returns for messages it
// cannot take as one fetched batch (none, another topic, several
// partitions, a negative offset).
var ErrDeliverInput = errors.New("consumer: deliver: invalid messages")

// Deliver runs msgs through one transaction of the runner, as if they were
// a batch the runner had fetched from one partition of Config.Topic, and
// talks to no broker. It is the code Run runs for a batch: each message's ID
// is taken as Run takes it (Config.IDHeader, IDFunc, MissingID), the IDs are
// claimed and the partition's position recorded in the statement that
// begins the transaction, the handler (Handler or BatchHandler, wrapped in
// its Middleware) runs for the newly claimed messages only, then COMMIT;
// the observers see it as they see Run's (TxStart and TxEnd frame the
// transaction, then each message's Outcome). outcomes[i] is
// msgs[i]'s: Applied or Duplicate (a copy of an ID earlier in the same call
// is a Duplicate). The position is read first, as a partition's assignment
// reads it, so that it moves as under Run.
//
// Unlike Run, Deliver does one transaction and decides nothing: a handler
// error (or panic, as an *idemkit.PanicError), a message without a usable ID
// (ErrMissingID), a serialization failure or a lost connection is returned
// with the transaction rolled back, and nothing is retried, parked or handed
// to OnFailure. Messages parked by a NonBlocking run are not consulted.
// Empty Topic fields are taken as Config.Topic. Deliver does not coordinate
// with a Run of the same runner.
//
// Deliver exists for tests of handlers (package idemtest drives it): what it
// runs is the production transaction, not a copy of it.
func (r *Runner) Deliver(ctx context.Context, msgs ...kafka.Message) (outcomes []Outcome, err error) {
	cfg := &r.cfg
	if len(msgs) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrDeliverInput)
	}
	msgs = slices.Clone(msgs) // the caller's slice stays as it was
	batch := make([]*Message, len(msgs))
	for i, m := range msgs {
		if m.Topic == "" {
			m.Topic = cfg.Topic
		}
		switch {
		case m.Topic != cfg.Topic:
			return nil, fmt.Errorf("%w: msgs[%d] is of topic %q, the runner consumes %q", ErrDeliverInput, i, m.Topic, cfg.Topic)
		case m.Partition != msgs[0].Partition:
			return nil, fmt.Errorf("%w: msgs[%d] is of partition %d, msgs[0] of %d: a batch is of one partition",
				ErrDeliverInput, i, m.Partition, msgs[0].Partition)
		case m.Partition < 0 || m.Offset < 0:
			return nil, fmt.Errorf("%w: msgs[%d] has partition %d, offset %d", ErrDeliverInput, i, m.Partition, m.Offset)
		}
		msgs[i] = m
	}
	partition := msgs[0].Partition
	positions, err := cfg.Store.ListPositions(ctx, cfg.pool, cfg.Name, cfg.Topic)
	if err != nil {
		return nil, fmt.Errorf("consumer: deliver: read the position: %w", err)
	}
	w := &worker{r: r, partition: partition, log: cfg.Logger.With("topic", cfg.Topic, "partition", partition)}
	for _, p := range positions {
		if p.Partition == partition {
			w.incarnation, w.epoch = p.Incarnation, p.Epoch
		}
	}
	for i, m := range msgs {
		batch[i] = w.message(m)
		if batch[i].ID == "" {
			return nil, fmt.Errorf("consumer: deliver: msgs[%d] (offset %d): %w", i, m.Offset, batch[i].idErr)
		}
	}
	_, outcomes, _, err = w.observedTx(ctx, batch, 1)
	if err != nil {
		return nil, err
	}
	return outcomes, nil
}
