package dlq_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// nearLimit is a key or value size whose dead letter fits Kafka's default
// max.message.bytes (1048588) at round 0, but not at round 1 with 4 KB more
// of error text.
const nearLimit = 1048588 - 3000

// deadLetterOf writes one dead letter for a message of origin topic at
// offset, as a consumer's OnFailure would.
func (e *env) deadLetterOf(w *dlq.Writer, origin string, offset int64, id string, key, value []byte) {
	e.t.Helper()
	msg := &consumer.Message{Message: kafka.Message{Topic: origin, Offset: offset, Key: key, Value: value,
		Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}, ID: id}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.OnFailure(ctx, msg, retry.Permanent(errors.New("first failure"))); err != nil {
		e.t.Fatal(err)
	}
}

// redrive runs a Redrive reprocessor whose handler fails with a 4 KB error
// for the IDs in fail and applies the rest.
func (e *env) redrive(fail map[string]bool) (dlq.Summary, []dlq.Item, error) {
	e.t.Helper()
	var items []dlq.Item
	rp, err := dlq.NewReprocessor(e.db.Pool, &dlq.ReprocessorConfig{Kafka: testenv.Kafka(e.t), Topic: e.dlq,
		Mode: dlq.Redrive, Tables: migrate.Tables{Schema: e.db.Schema}, Logger: e.logger,
		Retry:    retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2},
		Progress: func(it dlq.Item) { items = append(items, it) },
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if fail[m.ID] {
				return retry.Permanent(errors.New("still broken: " + strings.Repeat("x", 4096)))
			}
			return e.effect(ctx, tx, m)
		})})
	if err != nil {
		e.t.Fatal(err)
	}
	defer rp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := rp.Run(ctx)
	return sum, items, err
}

// TestLetterTooLargeForItsNextRoundIsStored: a dead letter that fits at
// round 0 but not at round 1 (its history and 4 KB more of error text) is
// written back with its value stored apart; the letter behind it is
// replayed in the same run, and the next run replays the stored one with
// its original bytes.
func TestLetterTooLargeForItsNextRoundIsStored(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	w, err := dlq.NewWriter(oversizeWriterConfig(e))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	value := bigValue(nearLimit)
	e.deadLetterOf(w, e.topic, 0, "a", []byte("k"), value)
	e.deadLetterOf(w, e.topic, 1, "b", []byte("k"), []byte("small"))
	if d := e.deadLetters()[0]; d.StoredValue != nil || len(d.Message.Value) != nearLimit {
		t.Fatalf("round 0 letter stored apart (%+v) or cut (%d bytes)", d.StoredValue, len(d.Message.Value))
	}
	sum, _, err := e.redrive(map[string]bool{"a": true})
	if err != nil || sum.Records[dlq.FailedAgain] != 1 || sum.Records[dlq.Applied] != 1 {
		t.Fatalf("first run: %v, %v; want a failed again, b applied", sum, err)
	}
	dls := e.deadLetters()
	if len(dls) != 3 || dls[2].Round != 1 || dls[2].StoredValue == nil || dls[2].StoredValue.Size != nearLimit {
		t.Fatalf("want a's round 1 letter with its value stored apart, got %d letters", len(dls))
	}
	var got []byte
	sum, _, err = e.redrive(nil)
	if err != nil || sum.Records[dlq.Applied] != 1 || sum.Records[dlq.AlreadyReplayed] != 2 {
		t.Fatalf("second run: %v, %v; want a's round 1 applied", sum, err)
	}
	if err := e.db.Pool.QueryRow(context.Background(), `SELECT value FROM `+e.db.Table("idemkit_dlq_values")).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(value) {
		t.Fatal("stored value differs from the original")
	}
	if runs := e.runs(); runs["a"] != 1 || runs["b"] != 1 {
		t.Fatalf("effects %v, want a and b once", runs)
	}
}

// TestWriteBackFailureIsTheLettersAction: a letter that cannot be written
// back (its key alone is too large for its next round) is that letter's
// WriteFailed, recorded with a detail naming it; the letter behind it is
// replayed in the same run, and the next run tries the failed one again.
func TestWriteBackFailureIsTheLettersAction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	w, err := dlq.NewWriter(oversizeWriterConfig(e))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	e.deadLetterOf(w, e.topic, 0, "a", bigValue(nearLimit), []byte("small"))
	e.deadLetterOf(w, e.topic, 1, "b", []byte("k"), []byte("small"))
	sum, items, err := e.redrive(map[string]bool{"a": true})
	if err != nil || sum.Records[dlq.WriteFailed] != 1 || sum.Records[dlq.Applied] != 1 {
		t.Fatalf("first run: %v, %v; want a write-failed, b applied", sum, err)
	}
	if it := items[0]; it.Action != dlq.WriteFailed || !errors.Is(it.Err, kafka.MessageSizeTooLarge) ||
		!strings.Contains(it.Err.Error(), `dead letter `+e.dlq+`/0/0 (message "a" from `+e.topic+`/0/0)`) {
		t.Fatalf("item %s: %v", it.Action, it.Err)
	}
	var outcome, detail string
	if err := e.db.Pool.QueryRow(context.Background(), `SELECT outcome, detail FROM `+e.db.Table("idemkit_dlq_replays")+
		` WHERE message_id = 'a'`).Scan(&outcome, &detail); err != nil || outcome != "write-failed" || !strings.Contains(detail, e.dlq+"/0/0") {
		t.Fatalf("record of a: %q %q %v", outcome, detail, err)
	}
	sum, _, err = e.redrive(nil)
	if err != nil || sum.Records[dlq.Applied] != 1 || sum.Records[dlq.AlreadyReplayed] != 1 {
		t.Fatalf("second run: %v, %v; want a applied", sum, err)
	}
	if runs := e.runs(); runs["a"] != 1 || runs["b"] != 1 {
		t.Fatalf("effects %v, want a and b once", runs)
	}
}

// TestRepublishFailureIsTheLettersAction: in Republish mode, a letter whose
// origin topic cannot be written is that letter's WriteFailed; the letter
// behind it is republished in the same run.
func TestRepublishFailureIsTheLettersAction(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	cfg := oversizeWriterConfig(e)
	cfg.Topic = e.dlq
	w, err := dlq.NewWriter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	e.deadLetterOf(w, testenv.Name(t, "gone"), 0, "a", []byte("k"), []byte("v")) // its origin topic does not exist
	e.deadLetterOf(w, e.topic, 1, "b", []byte("k"), []byte("v"))
	rp, err := dlq.NewReprocessor(e.db.Pool, &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: e.dlq,
		Mode: dlq.Republish, Tables: migrate.Tables{Schema: e.db.Schema}, Logger: e.logger,
		Retry: retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sum, err := rp.Run(ctx)
	if err != nil || sum.Records[dlq.WriteFailed] != 1 || sum.Records[dlq.Republished] != 1 {
		t.Fatalf("run: %v, %v; want a write-failed, b republished", sum, err)
	}
}
