package dlq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/retry"
)

// TestRepublishKeepsLineage: a republished message that the consumer fails
// again comes back with its history extended and its round increased, so
// that ReplayLimit ends the loop: with a limit of 2 the message goes around
// twice, then its third dead letter is exhausted.
func TestRepublishKeepsLineage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	e.produce("loop")
	var handled int
	always := func(*consumer.Message, int) error {
		handled++
		return retry.Permanent(errors.New("always broken"))
	}
	e.consume(1, always)
	limit := func(c *dlq.ReprocessorConfig) { c.ReplayLimit = 2 }
	republished := 0
	for run := 1; ; run++ {
		if run > 5 {
			t.Fatalf("after %d republishes the letter is still not exhausted: ReplayLimit does not bound the loop", republished)
		}
		sum, err := e.reprocessor(dlq.Republish, nil, limit).Run(ctx)
		if err != nil {
			t.Fatalf("run %d: %v", run, err)
		}
		if sum.Records[dlq.Exhausted] == 1 {
			break
		}
		if sum.Records[dlq.Republished] != 1 {
			t.Fatalf("run %d: %v, want one republished", run, sum)
		}
		republished++
		e.consume(1, always)
	}
	if republished != 2 || handled != 3 {
		t.Fatalf("republished %d times, handled %d times; want 2 and 3", republished, handled)
	}
	dls := e.deadLetters()
	if len(dls) != 3 {
		t.Fatalf("%d dead letters, want 3", len(dls))
	}
	for i, d := range dls {
		if d.MessageID != "loop" || d.Round != i || len(d.History) != i+1 || d.Origin.Offset != 0 || d.Origin.Topic != e.topic {
			t.Fatalf("dead letter %d: id %q round %d origin %+v history %+v; want round %d, %d failures, origin offset 0",
				i, d.MessageID, d.Round, d.Origin, d.History, i, i+1)
		}
		for j, f := range d.History {
			if f.Round != j || f.Error != "always broken" {
				t.Fatalf("dead letter %d, failure %d: %+v", i, j, f)
			}
		}
	}
	sum, err := e.reprocessor(dlq.Republish, nil, limit).Run(ctx)
	if err != nil || sum.Records[dlq.AlreadyReplayed] != 3 {
		t.Fatalf("after parking: %v, %v; want 3 already replayed", sum, err)
	}
}

// TestRedriveLimit: Redrive gives a dead letter ReplayLimit rounds too: the
// handler runs that many times, and the failure of the last round parks it.
func TestRedriveLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	e.produce("z")
	e.consume(1, func(*consumer.Message, int) error { return retry.Permanent(errors.New("v1")) })
	runs := 0
	broken := func(context.Context, pgx.Tx, *consumer.Message) error {
		runs++
		return retry.Permanent(errors.New("still broken"))
	}
	limit := func(c *dlq.ReprocessorConfig) { c.ReplayLimit = 2 }
	sum, err := e.reprocessor(dlq.Redrive, broken, limit).Run(ctx)
	if err != nil || sum.Records[dlq.FailedAgain] != 1 {
		t.Fatalf("round 1: %v, %v", sum, err)
	}
	sum, err = e.reprocessor(dlq.Redrive, broken, limit).Run(ctx)
	if err != nil || sum.Records[dlq.Exhausted] != 1 || sum.Records[dlq.AlreadyReplayed] != 1 {
		t.Fatalf("round 2: %v, %v", sum, err)
	}
	if dls := e.deadLetters(); runs != 2 || len(dls) != 2 {
		t.Fatalf("handler ran %d times, %d dead letters; want 2 and 2", runs, len(dls))
	}
}
