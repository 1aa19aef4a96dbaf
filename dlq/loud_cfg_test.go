package dlq_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

// loudWriterConfig is a writer that gives up after two attempts and reports
// each failure to report.
func loudWriterConfig(e *env, logger *slog.Logger, report func(*dlq.WriteFailure)) *dlq.WriterConfig {
	return &dlq.WriterConfig{Kafka: testenv.Kafka(e.t), Group: e.group, Logger: logger,
		Retry:       retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2},
		WriteFailed: func(_ context.Context, f *dlq.WriteFailure) { report(f) }}
}

func checkWriteFailures(t *testing.T, e *env, got []dlq.WriteFailure) {
	t.Helper()
	if len(got) != 2 {
		t.Fatalf("WriteFailed ran %d times, want 2", len(got))
	}
	for i, f := range got {
		if f.DLQTopic != e.dlq || f.Topic != e.topic || f.Partition != 0 || f.Offset != 7 || f.MessageID != "m-7" ||
			f.Attempt != i+1 || f.Final != (i == 1) || !errors.Is(f.Err, kafka.UnknownTopicOrPartition) {
			t.Errorf("failure %d: %+v", i, f)
		}
	}
}
