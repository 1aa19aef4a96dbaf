package consumer

import "time"

// SetClock replaces r's clock, for tests of a runner whose host clock
// differs from the database's. Call it before Run.
func SetClock(r *Runner, now func() time.Time) { r.now = now }
