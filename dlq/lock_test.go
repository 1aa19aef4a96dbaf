package dlq_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
)

// TestOneReplayPerTopic: while a replay of a dead-letter topic runs (held
// in its handler), another replay of it is refused with ErrReplayRunning
// and changes nothing; a dry run of it still runs; once the first ended,
// the second runs and finds its letter replayed.
func TestOneReplayPerTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, true)
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group, Logger: e.logger})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	e.deadLetter(w, "pay-1", 0)
	started, release := make(chan struct{}), make(chan struct{})
	first := e.reprocessor(dlq.Redrive, func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
		close(started)
		<-release
		return e.effect(ctx, tx, m)
	}, nil)
	ran := make(chan error, 1)
	go func() { _, err := first.Run(ctx); ran <- err }()
	<-started

	second := e.reprocessor(dlq.Republish, nil, nil)
	sum, err := second.Run(ctx)
	if !errors.Is(err, dlq.ErrReplayRunning) || sum.Records[dlq.Republished] != 0 {
		t.Fatalf("a replay beside another: %+v, %v; want ErrReplayRunning and nothing done", sum, err)
	}
	dry := e.reprocessor(dlq.Republish, nil, func(c *dlq.ReprocessorConfig) { c.DryRun = true })
	if sum, err := dry.Run(ctx); err != nil || sum.Records[dlq.WouldReplay] != 1 {
		t.Fatalf("a dry run beside a replay: %+v, %v; want 1 would-replay", sum, err)
	}
	close(release)
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if sum, err := second.Run(ctx); err != nil || sum.Records[dlq.AlreadyReplayed] != 1 {
		t.Fatalf("the replay after the first: %+v, %v; want 1 already replayed", sum, err)
	}
}
