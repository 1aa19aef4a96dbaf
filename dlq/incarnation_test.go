package dlq_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

// TestIncarnationsDoNotCollide: the origin topic was deleted and created
// again, so its offsets started over; two dead letters with the same origin
// coordinates from two incarnations are two dead letters, and both are
// replayed.
func TestIncarnationsDoNotCollide(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group, Logger: e.logger})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	now := time.Now()
	for inc, id := range []string{"before-recreate", "after-recreate"} {
		m := &consumer.Message{ID: id, Incarnation: int64(inc), Message: kafka.Message{Topic: e.topic, Partition: 0, Offset: 7,
			Key: []byte("k"), Value: []byte("v-" + id), Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}}
		merr := &consumer.MessageError{Topic: e.topic, Offset: 7, ID: id, Attempts: 1, Class: retry.ClassPermanent,
			FirstFailure: now, LastFailure: now, Err: errors.New("bug")}
		if err := w.OnFailure(ctx, m, merr); err != nil {
			t.Fatal(err)
		}
	}
	dls := e.deadLetters()
	if len(dls) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dls))
	}
	for i, d := range dls {
		if got := header(d, dlq.HeaderOriginIncarnation); got != []string{"0", "1"}[i] {
			t.Fatalf("dead letter %d: incarnation header %q, want %d", i, got, i)
		}
	}
	sum, err := e.reprocessor(dlq.Redrive, e.effect, nil).Run(ctx)
	if err != nil || sum.Records[dlq.Applied] != 2 {
		t.Fatalf("replay: %v, %v; want both applied", sum, err)
	}
	if runs := e.runs(); len(runs) != 2 || runs["before-recreate"] != 1 || runs["after-recreate"] != 1 {
		t.Fatalf("effects %v, want each once", runs)
	}
	sum, err = e.reprocessor(dlq.Redrive, e.effect, nil).Run(ctx)
	if err != nil || sum.Records[dlq.AlreadyReplayed] != 2 {
		t.Fatalf("replay again: %v, %v", sum, err)
	}
}
