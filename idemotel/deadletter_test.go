package idemotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

// TestDeadLetterWriteFailuresCounted: each failed attempt to write a dead
// letter (here: its topic does not exist) counts into
// idemkit_dead_letter_write_failures_total, which starts at 0, and the
// hook cfg already had still runs.
func TestDeadLetterWriteFailuresCounted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1)
	c, err := e.tel.Consumer(e.config(func(context.Context, pgx.Tx, *consumer.Message) error { return nil }))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	prev := 0
	wcfg := &dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group,
		Retry:       retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2},
		WriteFailed: func(context.Context, *dlq.WriteFailure) { prev++ }}
	if err := c.DeadLetterWriter(wcfg); err != nil {
		t.Fatal(err)
	}
	name := "idemkit.dead_letter.write_failures"
	key := lbl("consumer", e.group, "topic", e.topic, "dlq_topic", e.topic+dlq.TopicSuffixDefault)
	if got := points(t, e.collect(), name); len(got) != 1 || got[key] != 0 {
		t.Fatalf("before any failure: %v, want %s at 0", got, key)
	}
	w, err := dlq.NewWriter(wcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg := &consumer.Message{Message: kafka.Message{Topic: e.topic, Offset: 3, Value: []byte("v")}, ID: "x"}
	if err := w.OnFailure(ctx, msg, retry.Permanent(errors.New("boom"))); err == nil {
		t.Fatal("wrote to a topic that does not exist")
	}
	if got := points(t, e.collect(), name); got[key] != 2 || prev != 2 {
		t.Fatalf("after two failed attempts: %v, earlier hook ran %d times", got, prev)
	}
}
