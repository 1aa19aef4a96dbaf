package dlq_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
)

// TestScanReturnsFnError: an error of fn ends the scan and is returned as
// is, also a network error (fn's own database write): such an error is not
// taken for a broker outage, and no message is skipped.
func TestScanReturnsFnError(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 1)
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: topic, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(context.Background(), kafka.Message{Value: []byte("0")}, kafka.Message{Value: []byte("1")}, kafka.Message{Value: []byte("2")}); err != nil {
		t.Fatal(err)
	}
	w.Close()
	var seen []int64
	failed := false
	err := dlq.Scan(context.Background(), testenv.Kafka(t), topic, func(m kafka.Message) error {
		seen = append(seen, m.Offset)
		if m.Offset == 1 && !failed {
			failed = true
			return &net.OpError{Op: "write", Net: "tcp", Err: net.ErrClosed} // e.g. the archive DB went away
		}
		return nil
	})
	t.Logf("Scan = %v, fn saw offsets %v", err, seen)
	var opErr *net.OpError
	if !errors.As(err, &opErr) || !slices.Equal(seen, []int64{0, 1}) {
		t.Fatalf("Scan = %v after offsets %v; want fn's error after offsets 0 and 1", err, seen)
	}
}
