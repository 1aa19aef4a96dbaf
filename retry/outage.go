package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/kafkaconn"
)

// IsReadOnly reports whether err is PostgreSQL's read_only_sql_transaction
// (SQLSTATE 25006): a write in a read-only transaction. IsConnection counts
// it as an outage (a standby not yet promoted, a server set read-only); the
// connection that got it should be closed rather than reused, since a
// session made read-only stays so.
func IsReadOnly(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "25006"
}

// IsConnection reports whether err means a server could not be reached or a
// connection to it was lost, as opposed to a server that answered with a
// verdict. Such an error is an outage, not a property of the work: the
// runner, the outbox relay, the dead-letter writer and the reprocessor wait
// it out with backoff instead of giving up on a message or returning.
//
// Connection-class errors are:
//   - PostgreSQL SQLSTATE class 08 (connection exception), 57P01–57P03
//     (admin or crash shutdown, cannot connect now), class 53
//     (insufficient resources, e.g. too many connections) and 25006
//     (read_only_sql_transaction: the session is on a server that takes no
//     writes now — a standby not yet promoted during a failover, whose
//     sessions take writes once it is, or a server an operator set
//     read-only). idemkit's transactions are read-write, so 25006 from its
//     own statements is about the server; a handler that makes its own
//     transaction read-only meets it on a connection that stays open, which
//     the consumer charges to the handler as before;
//   - errors pgconn marks safe to retry (the request never reached the
//     server), network errors, refused or reset connections, an unexpected
//     EOF and a closed connection;
//   - Kafka errors that are temporary for a broker or its cluster: a broker
//     or coordinator that is not available or not yet loaded, a leader or
//     coordinator that moved, a request or network timeout.
//
// A cancelled or expired ctx of the caller is not a connection error, and
// neither is an *OutageError: the wait is over, its bound was reached.
func IsConnection(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, ErrOutage) {
		return false
	}
	if kafkaconn.Classify(err) != nil {
		// Refused credentials or certificates: the settings must change,
		// waiting for the broker does not help.
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case pgErr.Code[:2] == "08", pgErr.Code[:2] == "53":
			return true
		case pgErr.Code == "57P01", pgErr.Code == "57P02", pgErr.Code == "57P03":
			return true
		case pgErr.Code == "25006":
			return true
		}
		return false
	}
	var kafkaErr kafka.Error
	if errors.As(err, &kafkaErr) {
		switch kafkaErr {
		case kafka.LeaderNotAvailable, kafka.NotLeaderForPartition, kafka.RequestTimedOut,
			kafka.BrokerNotAvailable, kafka.NetworkException, kafka.GroupLoadInProgress,
			kafka.GroupCoordinatorNotAvailable, kafka.NotCoordinatorForGroup,
			kafka.NotEnoughReplicas, kafka.NotEnoughReplicasAfterAppend, kafka.KafkaStorageError,
			kafka.FencedLeaderEpoch, kafka.UnknownLeaderEpoch, kafka.OffsetNotAvailable,
			kafka.PreferredLeaderNotAvailable, kafka.EligibleLeadersNotAvailable,
			kafka.ElectionNotNeeded, kafka.ReplicaNotAvailable, kafka.UnstableOffsetCommit:
			return true
		}
		return false
	}
	var netErr net.Error
	var connectErr *pgconn.ConnectError
	switch {
	case pgconn.SafeToRetry(err), errors.As(err, &connectErr):
		return true
	case errors.As(err, &netErr), errors.Is(err, net.ErrClosed):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return true
	case errors.Is(err, context.DeadlineExceeded):
		// A request's own timeout (the caller's ctx is checked by callers).
		return true
	}
	// pgx reports a connection lost mid-statement as a plain error that
	// wraps none of the above; pgconn knows whether it is closed.
	return isClosedConn(err)
}

// isClosedConn recognises pgconn's error for a statement sent on a
// connection that had already died ("conn closed"); it wraps no sentinel.
func isClosedConn(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "conn closed" {
			return true
		}
	}
	return false
}

// ErrOutage is matched (errors.Is) by every *OutageError.
var ErrOutage = errors.New("outage lasted longer than allowed")

// OutageError is what a runner, relay, writer or reprocessor returns when a
// server stayed unreachable for longer than its MaxOutage. Err is the last
// connection error seen.
type OutageError struct {
	// Op names what could not reach its server, e.g. "consumer orders/3:
	// postgres" or "outbox relay: kafka".
	Op string
	// Since is when the outage began, Duration how long it lasted.
	Since    time.Time
	Duration time.Duration
	Err      error
}

func (e *OutageError) Error() string {
	return fmt.Sprintf("%s: unreachable for %s (since %s): %v", e.Op, e.Duration.Round(time.Millisecond),
		e.Since.UTC().Format(time.RFC3339), e.Err)
}

// Unwrap returns the last connection error.
func (e *OutageError) Unwrap() error { return e.Err }

// Is reports whether target is ErrOutage.
func (e *OutageError) Is(target error) bool { return target == ErrOutage }
