package dlq_test

import (
	"context"
	"errors"
	"maps"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

// deadLetter writes the dead letter of the message id at offset of e's
// topic, as the consumer's Writer does.
func (e *env) deadLetter(w *dlq.Writer, id string, offset int64) {
	e.t.Helper()
	now := time.Now()
	m := &consumer.Message{ID: id, Message: kafka.Message{Topic: e.topic, Offset: offset, Key: []byte("k"),
		Value: []byte("v-" + id), Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}}
	merr := &consumer.MessageError{Topic: e.topic, Offset: offset, ID: id, Attempts: 1, Class: retry.ClassPermanent,
		FirstFailure: now, LastFailure: now, Err: errors.New("bug")}
	if err := w.OnFailure(context.Background(), m, merr); err != nil {
		e.t.Fatal(err)
	}
}

// TestDryRunSaysWhatTheRunDoes: a dry run remembers what it decided earlier
// in the same run. The same message dead-lettered twice (a crash between
// the dead-letter write and the position commit) is one replay and one
// already-replayed, in the dry run as in the real run; in Redrive mode, a
// message ID dead-lettered from two offsets is applied once. The Summary
// counts dead-letter records, and per origin message.
func TestDryRunSaysWhatTheRunDoes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		mode                      dlq.Mode
		replayed                  dlq.Action
		wantRecords, wantMessages dlq.Counts
	}{
		{dlq.Redrive, dlq.Applied,
			dlq.Counts{dlq.Applied: 3, dlq.AlreadyReplayed: 1, dlq.AlreadyApplied: 1},
			dlq.Counts{dlq.Applied: 3, dlq.AlreadyApplied: 1}},
		{dlq.Republish, dlq.Republished,
			dlq.Counts{dlq.Republished: 4, dlq.AlreadyReplayed: 1},
			dlq.Counts{dlq.Republished: 4}},
	} {
		t.Run(map[dlq.Mode]string{dlq.Redrive: "Redrive", dlq.Republish: "Republish"}[tc.mode], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := newEnv(t, true)
			w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group, Logger: e.logger})
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			e.deadLetter(w, "twice", 3)
			e.deadLetter(w, "twice", 3) // the same dead letter again: a crash before the position moved
			e.deadLetter(w, "sent-twice", 4)
			e.deadLetter(w, "sent-twice", 5) // the producer sent it twice: two origins, one ID
			e.deadLetter(w, "single", 6)

			dry, err := e.reprocessor(tc.mode, e.effect, func(c *dlq.ReprocessorConfig) { c.DryRun = true }).Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			real, err := e.reprocessor(tc.mode, e.effect, nil).Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(real.Records, tc.wantRecords) || !maps.Equal(real.Messages, tc.wantMessages) {
				t.Fatalf("real run: records %v, messages %v; want %v, %v", real.Records, real.Messages,
					tc.wantRecords, tc.wantMessages)
			}
			// The dry run says would-replay where the run replayed, and
			// everything else alike.
			for _, c := range []struct {
				what      string
				dry, real dlq.Counts
			}{{"records", dry.Records, real.Records}, {"messages", dry.Messages, real.Messages}} {
				want := maps.Clone(c.real)
				want[dlq.WouldReplay] = want[tc.replayed]
				delete(want, tc.replayed)
				if !maps.Equal(c.dry, want) {
					t.Errorf("dry run %s %v, want %v (the real run: %v)", c.what, c.dry, want, c.real)
				}
			}
			if tc.mode == dlq.Redrive {
				if runs := e.runs(); len(runs) != 3 || runs["twice"] != 1 || runs["sent-twice"] != 1 || runs["single"] != 1 {
					t.Fatalf("effects %v, want each once", runs)
				}
			}
		})
	}
}
