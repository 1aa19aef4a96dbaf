package consumer

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/kafkaoffsets"
)

// PartitionStatus is what a running Runner knows of a partition it holds:
// for gauges (lag, position, parked) and status pages.
type PartitionStatus struct {
	Topic     string
	Partition int
	// Next is the offset of the first message whose effects this runner
	// has not committed: where the partition started, then the position
	// of its last committed transaction. A partition with no position yet
	// shows Config.StartOffset (kafka.FirstOffset or kafka.LastOffset, both
	// negative) until its first fetch answered.
	Next int64
	// LastStable and HighWatermark are the partition's as of the last fetch
	// or the last log-end read (every 2 s, so that a stuck partition's lag
	// still grows); -1 until either answered. Lag is LastStable - Next (the
	// messages a consumer in read_committed can see and has not processed),
	// never below 0; 0 until the first fetch (and while Next is negative).
	LastStable, HighWatermark int64
	Lag                       int64
	// Parked counts the partition's messages waiting in the parked table
	// (NonBlocking mode, or left by one) as this runner knows them.
	Parked int
	// Assigned is when the runner got the partition; Advanced when Next
	// last moved (Assigned until then).
	Assigned, Advanced time.Time
}

// partitionState is a worker's live PartitionStatus: written by the
// worker's goroutines, read by Partitions from any goroutine.
type partitionState struct {
	partition  int
	next       atomic.Int64
	lastStable atomic.Int64
	hwm        atomic.Int64
	parked     atomic.Int64
	assigned   time.Time
	advanced   atomic.Int64 // unix nanoseconds
}

func newPartitionState(partition int, start int64) *partitionState {
	s := &partitionState{partition: partition, assigned: time.Now()}
	s.next.Store(start)
	s.lastStable.Store(-1)
	s.hwm.Store(-1)
	s.advanced.Store(s.assigned.UnixNano())
	return s
}

// started replaces a start sentinel (kafka.FirstOffset, kafka.LastOffset:
// no position yet) by the offset the first fetch began at, so that Next and
// Lag are offsets before the first transaction commits.
func (s *partitionState) started(offset int64) {
	if n := s.next.Load(); n < 0 && offset >= 0 {
		s.next.CompareAndSwap(n, offset)
	}
}

// observeEnds records the partition's last stable offset and high
// watermark, as a fetch or the log-end refresher saw them; they only grow.
func (s *partitionState) observeEnds(lastStable, highWatermark int64) {
	storeMax(&s.lastStable, lastStable)
	storeMax(&s.hwm, highWatermark)
}

func storeMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// logEndInterval is how often a runner reads its partitions' log ends for
// Partitions, besides what fetches tell: a partition whose handler is stuck
// stops fetching once its buffer is full, and its lag must still grow.
const logEndInterval = 2 * time.Second

// refreshLogEnds reads the partitions' log ends every logEndInterval until
// the generation ends.
func (r *Runner) refreshLogEnds(genCtx context.Context, client *kafka.Client, partitions []int) {
	t := time.NewTicker(logEndInterval)
	defer t.Stop()
	for {
		select {
		case <-genCtx.Done():
			return
		case <-t.C:
		}
		ranges, err := kafkaoffsets.LogRange(genCtx, client, r.cfg.Topic, partitions...)
		if err != nil {
			continue // the fetches and the outage waits report what is wrong
		}
		r.states.mu.Lock()
		for p, rg := range ranges {
			if s := r.states.parts[p]; s != nil {
				s.observeEnds(rg.Stable, rg.End)
			}
		}
		r.states.mu.Unlock()
	}
}

func (s *partitionState) moved(next int64) {
	if next > s.next.Load() {
		s.next.Store(next)
		s.advanced.Store(time.Now().UnixNano())
	}
}

// partitionStates are the partitions a runner holds now.
type partitionStates struct {
	mu    sync.Mutex
	parts map[int]*partitionState
}

func (ps *partitionStates) add(s *partitionState) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.parts == nil {
		ps.parts = map[int]*partitionState{}
	}
	ps.parts[s.partition] = s
}

// remove forgets s unless another worker took its partition meanwhile.
func (ps *partitionStates) remove(s *partitionState) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.parts[s.partition] == s {
		delete(ps.parts, s.partition)
	}
}

// Partitions returns the partitions the runner holds now, in partition
// order. It is safe to call from any goroutine while Run runs (a metrics
// callback, a status handler); it is empty before partitions are assigned,
// during a rebalance and after Run returned.
func (r *Runner) Partitions() []PartitionStatus {
	r.states.mu.Lock()
	out := make([]PartitionStatus, 0, len(r.states.parts))
	for _, s := range r.states.parts {
		st := PartitionStatus{Topic: r.cfg.Topic, Partition: s.partition, Next: s.next.Load(),
			LastStable: s.lastStable.Load(), HighWatermark: s.hwm.Load(), Parked: int(s.parked.Load()),
			Assigned: s.assigned, Advanced: time.Unix(0, s.advanced.Load())}
		if st.Next >= 0 && st.LastStable > st.Next {
			st.Lag = st.LastStable - st.Next
		}
		out = append(out, st)
	}
	r.states.mu.Unlock()
	slices.SortFunc(out, func(a, b PartitionStatus) int { return a.Partition - b.Partition })
	return out
}
