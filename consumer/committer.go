package consumer

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// committer commits Kafka offsets for one generation. Workers mark the next
// offset of a partition once its transaction has committed in PostgreSQL; the
// committer sends the newest mark of every partition in one synchronous
// OffsetCommit request, and the next one no sooner than interval after it
// (marks coalesce meanwhile: Kafka's offsets trail by at most about that).
// The database position is the source of truth, so a Kafka offset only ever
// trails it, and the processing path never waits for the broker: on brokers
// whose group coordinator lingers a few milliseconds per commit, committing
// per transaction would cap a partition at a few hundred messages a second.
type committer struct {
	gen   *kafka.Generation
	topic string
	log   *slog.Logger
	obs   *observers

	interval time.Duration

	mu      sync.Mutex
	pending map[int]int64
	wake    chan struct{} // size 1: a mark arrived
	workers sync.WaitGroup

	failing int // commits failed in a row with a coordinator error (run's goroutine only)
}

// commitRetryDelay is the wait before an offset commit that failed with a
// coordinator error is sent again.
const commitRetryDelay = time.Second

// coordinatorBusy reports whether a failed offset commit says that the
// group coordinator could not write it now, not that the generation is
// over: on a cluster, the coordinator answers COORDINATOR_NOT_AVAILABLE (or
// a timeout) while __consumer_offsets waits for a replica that died and has
// not yet left the ISR, for as long as the broker session timeout, although
// the member, its generation and the coordinator are all still fine.
func coordinatorBusy(err error) bool {
	for _, e := range []kafka.Error{kafka.GroupCoordinatorNotAvailable, kafka.GroupLoadInProgress, kafka.RequestTimedOut,
		kafka.NotEnoughReplicas, kafka.NotEnoughReplicasAfterAppend} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func newCommitter(gen *kafka.Generation, topic string, interval time.Duration, log *slog.Logger, obs *observers) *committer {
	return &committer{gen: gen, topic: topic, interval: interval, log: log, obs: obs,
		pending: map[int]int64{}, wake: make(chan struct{}, 1)}
}

// mark records that every message of partition before next is committed in
// PostgreSQL.
func (c *committer) mark(partition int, next int64) {
	c.mu.Lock()
	if next > c.pending[partition] {
		c.pending[partition] = next
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run commits marks until the generation ends, then waits for the workers and
// commits their last marks. A commit the coordinator could not write now
// (coordinatorBusy) is sent again; any other failed commit ends the
// generation: the group rebalances and the next owner of each partition
// starts from PostgreSQL.
func (c *committer) run(genCtx context.Context) {
	for {
		select {
		case <-c.wake:
			if !c.flush(genCtx) {
				return
			}
		case <-genCtx.Done():
			c.workers.Wait()
			c.flush(genCtx)
			return
		}
		if c.interval > 0 {
			t := time.NewTimer(c.interval)
			select {
			case <-t.C:
			case <-genCtx.Done():
				t.Stop()
				c.workers.Wait()
				c.flush(genCtx)
				return
			}
		}
	}
}

func (c *committer) flush(genCtx context.Context) bool {
	c.mu.Lock()
	batch := c.pending
	c.pending = map[int]int64{}
	c.mu.Unlock()
	if len(batch) == 0 {
		return true
	}
	if err := c.gen.CommitOffsets(map[string]map[int]int64{c.topic: batch}); err != nil {
		c.obs.offsetCommit(genCtx, &OffsetCommitEvent{Topic: c.topic, Offsets: batch, Err: err})
		if genCtx.Err() == nil && coordinatorBusy(err) {
			// The generation goes on (its heartbeats end it if it is
			// really over): the offsets go again with the next commit, after
			// commitRetryDelay. Nothing waits for them.
			c.failing++
			if c.failing == 1 {
				c.log.Warn("kafka offset commit failed; keeping the generation and trying again (positions are safe in PostgreSQL)",
					"offsets", batch, "err", err)
			}
			c.mu.Lock()
			for p, next := range batch {
				if next > c.pending[p] {
					c.pending[p] = next
				}
			}
			c.mu.Unlock()
			t := time.NewTimer(commitRetryDelay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-genCtx.Done():
			}
			select {
			case c.wake <- struct{}{}:
			default:
			}
			return true
		}
		if genCtx.Err() == nil {
			c.log.Error("kafka offset commit failed; leaving the generation (positions are safe in PostgreSQL)",
				"offsets", batch, "err", err)
		} else {
			c.log.Debug("kafka offset commit after the generation ended", "offsets", batch, "err", err)
		}
		return false
	}
	if c.failing > 0 {
		c.log.Info("kafka offset commit succeeded again", "failed_before", c.failing)
		c.failing = 0
	}
	c.obs.offsetCommit(genCtx, &OffsetCommitEvent{Topic: c.topic, Offsets: batch})
	return true
}
