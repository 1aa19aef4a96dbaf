package dlq_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

// TestDeadLetterWriteFailuresAreLoud: every failed attempt to write a dead
// letter is logged at ERROR with the message's coordinates and reported to
// WriteFailed, the last one as final.
func TestDeadLetterWriteFailuresAreLoud(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false) // no dead-letter topic: every write fails
	logs, logger := testenv.NewLogs(t)
	var mu sync.Mutex
	var got []dlq.WriteFailure
	cfg := loudWriterConfig(e, logger, func(f *dlq.WriteFailure) {
		mu.Lock()
		got = append(got, *f)
		mu.Unlock()
	})
	w, err := dlq.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	msg := &consumer.Message{Message: kafka.Message{Topic: e.topic, Partition: 0, Offset: 7, Value: []byte("v")}, ID: "m-7"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.OnFailure(ctx, msg, retry.Permanent(errors.New("boom"))); err == nil {
		t.Fatal("OnFailure wrote to a topic that does not exist")
	}
	coords := func(rec map[string]any) bool {
		return rec["level"] == "ERROR" && rec["topic"] == e.topic && rec["partition"] == 0.0 && rec["offset"] == 7.0 &&
			rec["message_id"] == "m-7" && rec["dlq_topic"] == e.dlq
	}
	if n := logs.CountFunc("dead-letter write failed; the message waits and is tried again", coords); n != 1 {
		t.Errorf("%d ERROR logs of a retried write with coordinates, want 1", n)
	}
	if n := logs.CountFunc("dead-letter write failed; giving up: the message stays where it is", coords); n != 1 {
		t.Errorf("%d ERROR logs of the write given up with coordinates, want 1", n)
	}
	checkWriteFailures(t, e, got)
}
