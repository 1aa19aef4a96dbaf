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

// produceRaw writes msgs to the origin topic as they are.
func (e *env) produceRaw(msgs ...kafka.Message) {
	e.t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(e.t)...), Topic: e.topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond}
	defer w.Close()
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		e.t.Fatal(err)
	}
}

// TestLetterWithoutID: a dead letter without message ID (the consumer writes
// those itself for ErrMissingID) is one letter's outcome, never the end of
// the run: a dry run and a Redrive report it and go on with the next letter;
// Republish sends it back to its origin topic, where the consumer applies
// its MissingID policy again.
func TestLetterWithoutID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	e.produceRaw(kafka.Message{Key: []byte("k"), Value: []byte("v-none")})
	e.produce("after")
	e.consume(2, func(m *consumer.Message, _ int) error {
		return retry.Permanent(errors.New("bug"))
	})
	dls := e.deadLetters()
	if len(dls) != 2 || dls[0].MessageID != "" || dls[1].MessageID != "after" {
		t.Fatalf("dead letters %+v, want one without ID, then after", dls)
	}

	noID, republishedNoID := dlq.NoMessageID, dlq.RepublishedNoID
	var items []dlq.Item
	collect := func(c *dlq.ReprocessorConfig) { c.Progress = func(it dlq.Item) { items = append(items, it) } }
	checkNoID := func(what string, it dlq.Item, want dlq.Action) {
		t.Helper()
		if it.Action != want || it.DeadLetter == nil || it.Err == nil {
			t.Fatalf("%s: letter without ID: %+v, want %s with an error", what, it, want)
		}
		if msg := it.Err.Error(); !errors.Is(it.Err, dlq.ErrNoMessageID) || msg != "dlq: no message ID" {
			t.Fatalf("%s: error %q, want one that says \"no message ID\"", what, msg)
		}
	}

	// Dry run: reported, the next letter still considered, nothing changed.
	sum, err := e.reprocessor(dlq.Redrive, e.effect, func(c *dlq.ReprocessorConfig) { collect(c); c.DryRun = true }).Run(ctx)
	if err != nil || sum.Records[noID] != 1 || sum.Records[dlq.WouldReplay] != 1 || len(items) != 2 {
		t.Fatalf("dry run: %v, %v (%d items)", sum, err, len(items))
	}
	checkNoID("dry run", items[0], noID)

	// Redrive cannot deduplicate it: reported and left alone; the next is applied.
	items = nil
	sum, err = e.reprocessor(dlq.Redrive, e.effect, collect).Run(ctx)
	if err != nil || sum.Records[noID] != 1 || sum.Records[dlq.Applied] != 1 {
		t.Fatalf("redrive: %v, %v", sum, err)
	}
	checkNoID("redrive", items[0], noID)
	if runs := e.runs(); len(runs) != 1 || runs["after"] != 1 {
		t.Fatalf("effects %v, want after once", runs)
	}

	// Republish sends it back; a consumer that now derives IDs from
	// coordinates applies it.
	items = nil
	sum, err = e.reprocessor(dlq.Republish, nil, collect).Run(ctx)
	if err != nil || sum.Records[republishedNoID] != 1 || sum.Records[dlq.AlreadyReplayed] != 1 {
		t.Fatalf("republish: %v, %v", sum, err)
	}
	checkNoID("republish", items[0], republishedNoID)
	e.consumeWith(1, func(*consumer.Message, int) error { return nil }, func(c *consumer.Config) {
		c.MissingID = consumer.MissingIDUseCoordinates
	})
	if runs := e.runs(); len(runs) != 2 || runs[e.topic+"/0/2"] != 1 {
		t.Fatalf("effects %v, want after and %s/0/2 once", runs, e.topic)
	}
	sum, err = e.reprocessor(dlq.Republish, nil, nil).Run(ctx)
	if err != nil || sum.Records[dlq.AlreadyReplayed] != 2 {
		t.Fatalf("republish again: %v, %v", sum, err)
	}
}
