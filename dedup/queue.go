package dedup

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/internal/dedupq"
	"github.com/idemkit/idemkit/internal/pgexec"
)

func init() {
	dedupq.Of = func(store any) dedupq.Queuer { return queuer{store.(*Store)} }
}

// queuer is a store's dedupq.Queuer: the consumer's protocol with it.
type queuer struct{ s *Store }

func (q queuer) Layout(ctx context.Context, db pgexec.DB) (int, error) {
	l, err := q.s.cachedLayout(ctx, db)
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
