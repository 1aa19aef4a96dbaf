package dlq_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/retry"
)

// checkOutage fails the test unless err is a *retry.OutageError of at least
// maxOutage that came within a reasonable time after start.
func checkOutage(t *testing.T, what string, err error, start time.Time, maxOutage time.Duration) {
	t.Helper()
	var oerr *retry.OutageError
	if !errors.Is(err, retry.ErrOutage) || !errors.As(err, &oerr) || oerr.Duration < maxOutage {
		t.Fatalf("%s: %v; want a *retry.OutageError of at least %v", what, err, maxOutage)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("%s: gave up after %v, MaxOutage is %v", what, took, maxOutage)
	}
}

// TestWriterMaxOutage: past MaxOutage without Kafka, OnFailure gives up with
// a *retry.OutageError.
func TestWriterMaxOutage(t *testing.T) {
	t.Parallel()
	const maxOutage = 500 * time.Millisecond
	w, err := dlq.NewWriter(&dlq.WriterConfig{Brokers: []string{"127.0.0.1:1"}, Group: "g",
		Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), MaxOutage: maxOutage})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	start := time.Now()
	err = w.OnFailure(context.Background(), &consumer.Message{ID: "m", Message: kafka.Message{Topic: "orders"}},
		errors.New("bug"))
	checkOutage(t, "writer without Kafka", err, start, maxOutage)
}
