package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/retry"
)

func TestIsConnection(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("tx: %w", &pgconn.PgError{Code: code}) }
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"admin shutdown 57P01", pg("57P01"), true},
		{"crash shutdown 57P02", pg("57P02"), true},
		{"cannot connect now 57P03", pg("57P03"), true},
		{"connection failure 08006", pg("08006"), true},
		{"too many connections 53300", pg("53300"), true},
		{"read-only server 25006", pg("25006"), true},
		{"idle in transaction timeout 25P03", pg("25P03"), false},
		{"query canceled 57014", pg("57014"), false},
		{"unique violation 23505", pg("23505"), false},
		{"serialization failure 40001", pg("40001"), false},
		{"refused", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), true},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), true},
		{"net.OpError", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("no route")}, true},
		{"unexpected EOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"kafka not coordinator", fmt.Errorf("commit: %w", kafka.NotCoordinatorForGroup), true},
		{"kafka leader not available", kafka.LeaderNotAvailable, true},
		{"kafka unknown topic", kafka.UnknownTopicOrPartition, false},
		{"kafka message too large", kafka.MessageSizeTooLarge, false},
		{"caller cancelled", fmt.Errorf("x: %w", context.Canceled), false},
		{"a request timeout", fmt.Errorf("x: %w", context.DeadlineExceeded), true},
		{"plain error", errors.New("invalid amount"), false},
		{"pgconn conn closed", fmt.Errorf("exec: %w", errors.New("conn closed")), true},
	}
	for _, c := range cases {
		if got := retry.IsConnection(c.err); got != c.want {
			t.Errorf("%s: IsConnection(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

func TestOutageError(t *testing.T) {
	since := time.Date(2026, 12, 1, 4, 0, 0, 0, time.UTC)
	cause := fmt.Errorf("dial: %w", syscall.ECONNREFUSED)
	err := fmt.Errorf("consumer: %w", &retry.OutageError{Op: "consumer g/t: partition 3", Since: since, Duration: 90 * time.Second, Err: cause})
	if !errors.Is(err, retry.ErrOutage) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("%v does not match ErrOutage and its cause", err)
	}
	var oe *retry.OutageError
	if !errors.As(err, &oe) || oe.Duration != 90*time.Second {
		t.Fatalf("errors.As: %+v", oe)
	}
	want := "consumer: consumer g/t: partition 3: unreachable for 1m30s (since 2026-12-01T04:00:00Z): dial: connection refused"
	if err.Error() != want {
		t.Fatalf("Error() = %q, want %q", err.Error(), want)
	}
}
