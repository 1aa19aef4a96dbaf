package consumer

import (
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrMissingID means a message carried no usable ID and the MissingID policy
// is MissingIDFail. It is never retried.
var ErrMissingID = errors.New("consumer: message has no usable ID")

// MessageError is what Run returns when a message failed for good and no
// OnFailure took it: the runner stopped, and the message's offset did not move.
type MessageError struct {
	Topic     string
	Partition int
	Offset    int64
	ID        string
	Attempts  int
	Err       error
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("consumer: message %s/%d/%d (id %q) failed after %d attempt(s): %v",
		e.Topic, e.Partition, e.Offset, e.ID, e.Attempts, e.Err)
}

func (e *MessageError) Unwrap() error { return e.Err }

// PanicError is a handler panic turned into an error. Stack is the stack of
// the panicking goroutine; Error leaves it out to keep log lines short.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("consumer: handler panicked: %v", e.Value) }

func recoverPanic(err *error) {
	if v := recover(); v != nil {
		*err = &PanicError{Value: v, Stack: debug.Stack()}
	}
}

// RetryPolicy decides whether a failed message runs again.
type RetryPolicy interface {
	// Backoff is called after the attempt-th failure (attempt starts at 1)
	// with its error. It returns how long to wait before the next attempt, or
	// retry=false to give up.
	Backoff(attempt int, err error) (delay time.Duration, retry bool)
}

// Exponential is a bounded exponential RetryPolicy without jitter; package
// retry offers jittered, classified policies.
type Exponential struct {
	Initial     time.Duration // delay after the first failure
	Max         time.Duration // cap on one delay
	MaxAttempts int           // attempts in all, the first one included
}

// DefaultRetry returns the policy used when Config.Retry is nil: up to 5
// attempts, waiting 100ms, 200ms, 400ms, 800ms.
func DefaultRetry() RetryPolicy {
	return Exponential{Initial: 100 * time.Millisecond, Max: 5 * time.Second, MaxAttempts: 5}
}

// Backoff implements RetryPolicy. A message without ID is never retried.
func (p Exponential) Backoff(attempt int, err error) (time.Duration, bool) {
	if attempt >= p.MaxAttempts || errors.Is(err, ErrMissingID) {
		return 0, false
	}
	d := p.Initial
	for i := 1; i < attempt && d < p.Max; i++ {
		d *= 2
	}
	return min(d, p.Max), true
}

// retryableTx reports whether a whole transaction may simply run again:
// serialization failures and deadlocks.
func retryableTx(err error) bool {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "40001" || pgErr.Code == "40P01"
	}
	return false
}
