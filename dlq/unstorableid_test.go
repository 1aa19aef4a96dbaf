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
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestLetterWithUnstorableID: a dead letter whose message-id header
// holds NUL (a letter written by another tool, or edited) is a per-letter
// outcome like a letter without ID: Republish sends it back once, records
// it with an empty message ID, and a second run finds it replayed. Recorded
// raw, PostgreSQL rejects NUL (SQLSTATE 22021) after the letter was
// republished; Run returned, and every rerun republished it again.
func TestLetterWithUnstorableID(t *testing.T) {
	t.Parallel()
	// The message ID, or the consumer name it is claimed under, holds a NUL.
	for _, header := range []string{dlq.HeaderMessageID, dlq.HeaderConsumer} {
		t.Run(header, func(t *testing.T) {
			t.Parallel()
			letterWithUnstorableField(t, header)
		})
	}
}

func letterWithUnstorableField(t *testing.T, field string) {
	ctx := context.Background()
	e := newEnv(t, true)
	e.produce("a")
	e.consume(1, func(*consumer.Message, int) error { return retry.Permanent(errors.New("bug")) })
	var raw kafka.Message
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := dlq.Scan(sctx, testenv.Kafka(t), e.dlq, func(m kafka.Message) error { raw = m; return nil }); err != nil {
		t.Fatal(err)
	}
	bad := kafka.Message{Key: raw.Key, Value: raw.Value}
	for _, h := range raw.Headers {
		switch h.Key {
		case field:
			h.Value = []byte("a\x00b")
		case dlq.HeaderOriginOffset:
			h.Value = []byte("7")
		}
		bad.Headers = append(bad.Headers, h)
	}
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: e.dlq, RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond}
	if err := w.WriteMessages(ctx, bad); err != nil {
		t.Fatal(err)
	}
	w.Close()

	for round := 1; round <= 2; round++ {
		sum, err := e.reprocessor(dlq.Republish, nil, nil).Run(ctx)
		t.Logf("republish run %d: %v, %v", round, sum, err)
		if err != nil {
			t.Fatalf("run %d stopped on one letter: %v", round, err)
		}
	}
	// The bad letter's record holds no message ID, as a letter without one.
	var id, outcome string
	if err := e.db.Pool.QueryRow(ctx, `SELECT message_id, outcome FROM `+e.db.Table(migrate.DLQReplaysDefault)+
		` WHERE origin_offset = 7`).Scan(&id, &outcome); err != nil {
		t.Fatalf("replay record of the bad letter: %v", err)
	}
	if id != "" || outcome != string(dlq.RepublishedNoID) {
		t.Fatalf("replay record of the bad letter: message_id %q, outcome %q; want \"\", %q", id, outcome, dlq.RepublishedNoID)
	}
	copies := 0
	sctx2, cancel2 := context.WithTimeout(ctx, 30*time.Second)
	defer cancel2()
	if err := dlq.Scan(sctx2, testenv.Kafka(t), e.topic, func(m kafka.Message) error {
		if string(m.Value) == "v-a" {
			copies++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The original, the good letter's copy, one copy of the bad letter.
	if copies != 3 {
		t.Fatalf("%d records of the message in its origin topic after two runs, want 3 (the bad letter republished once)", copies)
	}
}
