package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/retry"
)

// ErrMissingID means a message carried no usable ID and the MissingID policy
// is MissingIDFail. It is never retried.
var ErrMissingID = errors.New("consumer: message has no usable ID")

// ErrBeyondHorizon matches (errors.Is) every *HorizonError: a message whose
// record timestamp is older than the dedup horizon (Config.Retention minus
// Config.HorizonMargin) and whose claim came back new. Its dedup record, if
// it ever had one, may have been purged, so "new" cannot be told from
// "applied before and forgotten". With HorizonFail (the default) the runner
// does not apply it: it goes to OnFailure with this error, without retries.
var ErrBeyondHorizon = errors.New("consumer: message older than the dedup horizon")

// HorizonError is the error of a message beyond the dedup horizon; it
// matches ErrBeyondHorizon and retry.IsPermanent.
type HorizonError struct {
	// Time is the message's record timestamp.
	Time time.Time
	// Age is how old the message was when its claim came back new, by this
	// process's clock.
	Age time.Duration
	// Horizon is Config.Retention minus Config.HorizonMargin: the age past
	// which a claim is not trusted (with Cause, the days the daily layout
	// keeps).
	Horizon time.Duration
	// Cause is set when the dedup store itself could not claim the message:
	// dedup.ErrPartitionDropped, its ID's day is older than the daily
	// partitions kept. Such a message is never applied, whatever
	// Config.OnBeyondHorizon says: there is nowhere to record its claim.
	Cause error
}

func (e *HorizonError) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%v: %v", ErrBeyondHorizon, e.Cause)
	}
	return fmt.Sprintf("%v: its timestamp %s is %s old, past the horizon of %s (Retention minus HorizonMargin): its dedup record may have been purged",
		ErrBeyondHorizon, e.Time.UTC().Format(time.RFC3339Nano), e.Age.Round(time.Millisecond), e.Horizon)
}

// Is reports whether target is ErrBeyondHorizon, or what Cause matches.
func (e *HorizonError) Is(target error) bool {
	return target == ErrBeyondHorizon || e.Cause != nil && errors.Is(e.Cause, target)
}

// Unwrap marks the error permanent: retrying cannot make it younger.
func (e *HorizonError) Unwrap() error { return retry.Permanent(ErrBeyondHorizon) }

// MessageError is what Run returns when a message failed for good and no
// OnFailure took it: the runner stopped, and the message's offset did not move.
type MessageError struct {
	Topic     string
	Partition int
	Offset    int64
	ID        string
	// Attempts is how many times the handler ran (or 1 for a message that
	// never reached it, such as one without ID).
	Attempts int
	// Class is retry.ClassPermanent for an error that must not be retried,
	// retry.ClassTransient when the retries were used up.
	Class retry.Class
	// FirstFailure and LastFailure are when the first and the last attempt failed.
	FirstFailure, LastFailure time.Time
	// Err is the last attempt's error.
	Err error
}

func (e *MessageError) Error() string {
	return fmt.Sprintf("consumer: message %s/%d/%d (id %q) failed (%s) after %d attempt(s): %v",
		e.Topic, e.Partition, e.Offset, e.ID, e.Class, e.Attempts, e.Err)
}

func (e *MessageError) Unwrap() error { return e.Err }

// recoverPanic turns a panic of the user code where names into an
// *idemkit.PanicError in *err.
func recoverPanic(where string, err *error) {
	if v := recover(); v != nil {
		*err = idemkit.NewPanicError(where, v)
	}
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
