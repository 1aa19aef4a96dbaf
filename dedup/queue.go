package dedup

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/internal/dedupq"
	"github.com/idemkit/idemkit/internal/pgexec"
)

func init() {
	dedupq.Of = func(store any) dedupq.Queuer { return queuer{store.(*Store)} }
}

// queuer is a store's dedupq.Queuer: the consumer's protocol with it.
type queuer struct{ s *Store }

func (q queuer) Layout(ctx context.Context, db pgexec.DB, bound time.Duration) (int, error) {
	if l := q.s.layout.Load(); l != nil && !l.stale {
		return l.KeepDays, nil
	}
	if bound > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	l, err := q.s.Layout(ctx, db)
	return l.KeepDays, err
}

func (q queuer) QueueClaimMove(b *pgx.Batch, c dedupq.Claim, duplicate, moved *bool) error {
	return q.s.queueClaimMove(b, Claim(c), duplicate, moved)
}

func (q queuer) QueueClaimBatch(b *pgx.Batch, claims []dedupq.Claim, duplicate *[]bool) error {
	cs := make([]Claim, len(claims))
	for i, c := range claims {
		cs[i] = Claim(c)
	}
	return q.s.queueClaimBatch(b, cs, duplicate)
}
