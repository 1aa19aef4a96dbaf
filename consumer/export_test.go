package consumer

import "time"

// SetClock replaces r's clock, for tests of a runner whose host clock
// differs from the database's. Call it before Run.
func SetClock(r *Runner, now func() time.Time) { r.now = now }

// SetTopicWait sets how long r asks again for a topic the brokers do not
// know.
func SetTopicWait(r *Runner, d time.Duration) { r.topicWait = d }

// SetLockWaitWarn sets how long claims wait for another session's lock
// before the runner logs who holds it, and returns a function that puts it
// back. Tests that change it must not run in parallel with others.
func SetLockWaitWarn(d time.Duration) (restore func()) {
	saved := lockWaitWarn
	lockWaitWarn = d
	return func() { lockWaitWarn = saved }
}
