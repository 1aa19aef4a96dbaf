package consumer

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SetClock replaces r's clock, for tests of a runner whose host clock
// differs from the database's. Call it before Run.
func SetClock(r *Runner, now func() time.Time) { r.now = now }

// ChainsTurnedAway returns how many transactions r did not chain because
// the pool's chain budget had no room.
func ChainsTurnedAway(r *Runner) int64 { return r.chainsTurnedAway.Load() }

// ChainBudgetHeld returns how many chained transactions the chain budget of
// pool counts now.
func ChainBudgetHeld(pool *pgxpool.Pool) int32 { return budgetOf(pool).held.Load() }
