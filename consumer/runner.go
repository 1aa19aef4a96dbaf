package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// Message is a Kafka message with its dedup ID.
type Message struct {
	kafka.Message
	// ID is the message ID the runner claimed in the dedup store.
	ID string
	// Incarnation says which incarnation of the topic the message came from,
	// as this consumer knows it: 0 until the topic was deleted and created
	// again under the same name and the consumer was moved onto the new one
	// (see ErrTopicRecreated), then 1, 2, … Offsets of two incarnations are
	// unrelated, so coordinates (topic, partition, offset) identify a record
	// only together with it.
	Incarnation int64

	idErr error // why no usable ID was found, when ID is empty
}

// Runner consumes one topic with a consumer group and runs the handler once
// per message ID. Create it with New; Run it once.
type Runner struct {
	cfg Config
	sem chan struct{} // bounds the partitions processed at once
}

// New validates cfg, applies its defaults and returns a Runner.
func New(cfg *Config) (*Runner, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Runner{cfg: c, sem: make(chan struct{}, c.MaxPartitions)}, nil
}

// Run consumes until ctx is cancelled or a message fails for good with no
// OnFailure to take it. It returns nil after a cancellation, and only after
// every goroutine it started has exited: fetching stops, a transaction in
// flight is rolled back (its messages come back later) or, if its handlers
// had already succeeded, committed; the last positions go to Kafka; what
// committed stays committed.
func (r *Runner) Run(ctx context.Context) error {
	if err := r.requireTopic(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)

	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                r.cfg.GroupID,
		Brokers:           r.cfg.Brokers,
		Dialer:            r.cfg.Dialer,
		Topics:            []string{r.cfg.Topic},
		StartOffset:       r.cfg.StartOffset,
		SessionTimeout:    r.cfg.SessionTimeout,
		HeartbeatInterval: r.cfg.SessionTimeout / 4,
		RebalanceTimeout:  r.cfg.SessionTimeout,
		JoinGroupBackoff:  time.Second,
	})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	log := r.cfg.Logger.With("topic", r.cfg.Topic, "group", r.cfg.GroupID)

	var (
		wg    sync.WaitGroup
		fatal error
		once  sync.Once
	)
	fail := func(err error) {
		once.Do(func() { fatal = err; cancel(err) })
	}
	// Closing the group ends the current generation, whose context the
	// partition workers watch; it returns once they have exited.
	closed := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-ctx.Done()
		_ = group.Close()
		close(closed)
	}()
	if r.cfg.Retention > 0 {
		wg.Go(func() { r.purgeLoop(ctx, log) })
	}

	for {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				break
			}
			// kafka-go backs off and joins again; say why we wait.
			log.Warn("consumer group: waiting for a generation", "err", err)
			continue
		}
		if err := r.startGeneration(ctx, gen, fail); err != nil {
			fail(err)
			break
		}
	}
	cancel(nil)
	<-closed
	wg.Wait()
	return fatal
}

// purgeLoop deletes the dedup records of this consumer's store older than
// Config.Retention, every PurgeInterval, until ctx ends.
func (r *Runner) purgeLoop(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(r.cfg.PurgeInterval)
	defer t.Stop()
	for {
		n, err := r.cfg.Store.Purge(ctx, r.cfg.Pool, r.cfg.Retention, 0)
		switch {
		case err != nil && ctx.Err() == nil:
			log.Error("dedup retention purge failed; next try at the next interval", "err", err)
		case n > 0:
			log.Info("dedup retention purge", "deleted", n, "older_than", r.cfg.Retention)
		}
		if h := r.cfg.Hooks.Purged; h != nil && err == nil {
			h(n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ErrTopicNotFound means the topic to consume does not exist. The runner
// never creates topics: create it (with the partition count you need) first.
var ErrTopicNotFound = errors.New("consumer: topic does not exist")

// requireTopic checks that the topic exists before joining the group, so
// that a typo or a missing topic is an error, not a silent wait.
func (r *Runner) requireTopic(ctx context.Context) error {
	var transport kafka.RoundTripper
	if d := r.cfg.Dialer; d != nil {
		dial := d.DialFunc
		if dial == nil {
			dial = (&net.Dialer{Timeout: d.Timeout, LocalAddr: d.LocalAddr}).DialContext
		}
		t := &kafka.Transport{Dial: dial, SASL: d.SASLMechanism, TLS: d.TLS, ClientID: d.ClientID}
		defer t.CloseIdleConnections()
		transport = t
	}
	client := &kafka.Client{Addr: kafka.TCP(r.cfg.Brokers...), Timeout: 30 * time.Second, Transport: transport}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{r.cfg.Topic}})
	if err != nil {
		return fmt.Errorf("consumer: metadata for topic %s: %w", r.cfg.Topic, err)
	}
	if len(md.Topics) != 1 || errors.Is(md.Topics[0].Error, kafka.UnknownTopicOrPartition) {
		return fmt.Errorf("%w: %s (create it first; idemkit never creates topics)", ErrTopicNotFound, r.cfg.Topic)
	}
	if err := md.Topics[0].Error; err != nil {
		return fmt.Errorf("consumer: metadata for topic %s: %w", r.cfg.Topic, err)
	}
	return nil
}

// startGeneration starts one worker per assigned partition, each at the later
// of Kafka's committed offset and the position recorded in PostgreSQL.
func (r *Runner) startGeneration(ctx context.Context, gen *kafka.Generation, fail func(error)) error {
	assigned := gen.Assignments[r.cfg.Topic]
	if len(assigned) == 0 {
		return nil
	}
	positions, err := r.cfg.Store.Positions(ctx, r.cfg.Pool, r.cfg.Name, r.cfg.Topic)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("consumer: read positions: %w", err)
	}
	commits := newCommitter(gen, r.cfg.Topic, r.cfg.Logger.With("topic", r.cfg.Topic), r.cfg.Hooks.OffsetCommitted)
	commits.workers.Add(len(assigned))
	for _, a := range assigned {
		start := a.Offset
		if pos, ok := positions[a.ID]; ok && (start < 0 || pos > start) {
			start = pos
		}
		w := &worker{r: r, commits: commits, partition: a.ID, start: start, fail: fail,
			log: r.cfg.Logger.With("topic", r.cfg.Topic, "partition", a.ID)}
		if h := r.cfg.Hooks.Assigned; h != nil {
			h(r.cfg.Topic, a.ID, start)
		}
		gen.Start(func(genCtx context.Context) {
			defer commits.workers.Done()
			w.run(ctx, genCtx)
		})
	}
	gen.Start(commits.run)
	return nil
}
