// Package dedupq is the consumer's protocol with the dedup store: the
// claims a transaction queues after its BEGIN, so that BEGIN and the claims
// travel to PostgreSQL in one round trip, and the layout those claims are
// routed by. Package dedup implements it; the consumer reaches a store's
// through Of. It is not part of idemkit's API.
package dedupq

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/internal/pgexec"
)

// Claim is dedup.Claim (the same fields, convertible both ways).
type Claim struct {
	Consumer  string
	MessageID string
	Topic     string
	Partition int
	Offset    int64
	Time      time.Time
	Epoch     int64
}

// Queuer queues a store's claims on a batch that begins a transaction (it
// must come after b.BeginTx, as pgx requires). Outcomes are stored when the
// batch's results are read (pgx.BatchResults.Close), which returns a
// statement's error, wrapped as the store's claim methods wrap theirs.
// Invalid input returns an error matching dedup.ErrInvalidInput and queues
// nothing.
type Queuer interface {
	// Layout makes the schema's dedup layout known, reading it through db
	// the first time and after a queued claim found it out of date: claims
	// of UUIDv7 IDs are routed by it and cannot read it (they fail with
	// dedup.ErrLayoutUnknown before it was read). It returns the days the
	// daily layout keeps (0: flat, or no limit). A read that gets no
	// answer within bound (when positive) is given up.
	Layout(ctx context.Context, db pgexec.DB, bound time.Duration) (keepDays int, err error)
	// QueueClaimMove queues the claim of c and an UPDATE that moves its
	// partition's position row to c.Offset+1 (never back, the anchor moved
	// with a known time, under c.Epoch only): *duplicate is the claim's
	// outcome, *moved whether the row moved. When it did not (no row yet,
	// one ahead, another epoch), the caller calls dedup.Store.SavePositionTx
	// in the same transaction, which inserts a missing row.
	QueueClaimMove(b *pgx.Batch, c Claim, duplicate, moved *bool) error
	// QueueClaimBatch queues the claims of one statement, with the
	// position of each (consumer, topic, partition); (*duplicate)[i] is
	// claims[i]'s outcome.
	QueueClaimBatch(b *pgx.Batch, claims []Claim, duplicate *[]bool) error
}

// Of returns the Queuer of store, a *dedup.Store. Package dedup sets it.
var Of func(store any) Queuer
