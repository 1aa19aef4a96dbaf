package console

import (
	"context"

	"github.com/idemkit/idemkit/outbox"
)

// The outbox's given-up messages, which the console calls "dead": every use
// of the outbox package's names for them is in this file.

// deadOutboxMessage is a message the relay or a dispatcher gave up on, or
// one held behind such a message of its key.
type deadOutboxMessage = outbox.DeadMessage

// outboxOf is the overview's outbox line.
func outboxOf(table string, st outbox.Stats) *outboxSummary {
	return &outboxSummary{Table: table, Backlog: st.Backlog, OldestAgeSeconds: st.OldestAge.Seconds(), Dead: st.Dead, Held: st.Held}
}

// deadOutbox lists the outbox's dead messages (at most
// outbox.DeadLimitDefault).
func (c *Console) deadOutbox(ctx context.Context) ([]deadOutboxMessage, error) {
	return c.outbox.Dead(ctx, c.pool)
}

// deadOutboxLimit is how many dead messages deadOutbox returns at most.
const deadOutboxLimit = outbox.DeadLimitDefault

// deadOutboxCLI is the CLI command that lists them.
const deadOutboxCLI = "idemkit outbox dead"
