package dedup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// Position is what a consumer recorded for one partition of a topic.
type Position struct {
	Partition int
	// Next is the offset of the first message whose effects are not
	// committed: where the consumer goes on.
	Next int64
	// Incarnation counts the recreations of the topic that this consumer was
	// moved onto (SeekTx with newIncarnation): 0 for the topic it first read.
	Incarnation int64
	// AnchorTime is the timestamp of the record at AnchorOffset, the last
	// data record the consumer passed (Next-1, or before it when the
	// position moved on over transaction markers); the zero time, with
	// AnchorOffset -1, when it is not known (after a seek).
	AnchorTime   time.Time
	AnchorOffset int64
	// Epoch counts the seeks of the position (SeekTx): position writes made
	// with an older epoch leave it as it is.
	Epoch int64
	// UpdatedAt is when the position was last written.
	UpdatedAt time.Time
}

func scanPositions(rows pgx.Rows) ([]Position, error) {
	var (
		out    []Position
		p      Position
		anchor *time.Time
	)
	_, err := pgx.ForEachRow(rows, []any{&p.Partition, &p.Next, &p.Incarnation, &anchor, &p.AnchorOffset, &p.Epoch, &p.UpdatedAt}, func() error {
		p.AnchorTime = time.Time{}
		if anchor != nil {
			p.AnchorTime = *anchor
		} else {
			p.AnchorOffset = -1
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// ListPositions returns consumer's recorded positions in topic, one per
// partition that has one, in partition order.
func (s *Store) ListPositions(ctx context.Context, db DBTX, consumer, topic string) ([]Position, error) {
	if err := ValidateID("Consumer", consumer); err != nil {
		return nil, fmt.Errorf("dedup: list positions: %w", &inputError{err: err})
	}
	if err := validateTopic(topic); err != nil {
		return nil, fail("list positions", err)
	}
	rows, err := db.Query(ctx, s.sql.listPositions, consumer, topic)
	if err != nil {
		return nil, fail("list positions", err)
	}
	out, err := scanPositions(rows)
	if err != nil {
		return nil, fail("list positions", err)
	}
	return out, nil
}

// SeekTx moves consumer's positions in topic, in tx, to the offsets in to
// (partition → next offset), backwards or forwards: it is the one way a
// position moves back (the writes of the consumer only move positions on).
// Partitions without a position get one. Every position written has its
// AnchorTime cleared: the consumer trusts it and anchors it again at its next
// commit. Every position written gets a new Epoch: a consumer that read the
// position before the seek (a member removed by a forced seek, whose
// transaction was in flight) can no longer move it on; its claims still
// commit, so what it applied comes back as duplicates after the seek.
//
// SeekTx first locks every position of consumer in topic (FOR UPDATE), so
// that before is what the seek replaced: the positions of the partitions in
// to that had one. after holds the positions written, in partition order.
//
// The incarnation of a position already recorded stays as it is; a new
// position gets the highest incarnation recorded for the topic (0 when none).
// With newIncarnation, every position written gets that highest incarnation
// plus one: the operator's word that the topic was deleted and created again
// (or lost records it had), so that coordinates of the new incarnation never
// match those of the old one.
//
// Moving only the positions does not rewind a consumer whose Kafka offsets
// are further on (it starts at the later of the two): `idemkit consumer seek`
// moves both.
func (s *Store) SeekTx(ctx context.Context, tx pgx.Tx, consumer, topic string, to map[int]int64,
	newIncarnation bool) (before, after []Position, err error) {
	if err := ValidateID("Consumer", consumer); err != nil {
		return nil, nil, fmt.Errorf("dedup: seek: %w", &inputError{err: err})
	}
	if err := validateTopic(topic); err != nil {
		return nil, nil, fail("seek", err)
	}
	if len(to) == 0 {
		return nil, nil, fmt.Errorf("dedup: seek: %w", invalid("no partition to move"))
	}
	partitions := slices.Sorted(maps.Keys(to))
	for _, p := range partitions {
		if err := validatePartition(p); err != nil {
			return nil, nil, fail("seek", err)
		}
		if to[p] < 0 {
			return nil, nil, fmt.Errorf("dedup: seek: %w", invalid("invalid next offset %d for partition %d", to[p], p))
		}
	}
	if tx == nil {
		return nil, nil, errors.New("dedup: seek: nil tx")
	}

	rows, err := tx.Query(ctx, s.sql.lockPositions, consumer, topic)
	if err != nil {
		return nil, nil, fail("seek", err)
	}
	locked, err := scanPositions(rows)
	if err != nil {
		return nil, nil, fail("seek", err)
	}
	var top int64
	current := map[int]Position{}
	for _, p := range locked {
		top = max(top, p.Incarnation)
		current[p.Partition] = p
		if _, ok := to[p.Partition]; ok {
			before = append(before, p)
		}
	}

	ids := make([]int32, len(partitions))
	next := make([]int64, len(partitions))
	incarnations := make([]int64, len(partitions))
	for i, p := range partitions {
		ids[i], next[i], incarnations[i] = int32(p), to[p], top
		switch cur, ok := current[p]; {
		case newIncarnation:
			incarnations[i] = top + 1
		case ok:
			incarnations[i] = cur.Incarnation
		}
	}
	rows, err = tx.Query(ctx, s.sql.seekPositions, consumer, topic, ids, next, incarnations)
	if err != nil {
		return nil, nil, fail("seek", err)
	}
	after, err = scanPositions(rows)
	if err != nil {
		return nil, nil, fail("seek", err)
	}
	slices.SortFunc(after, func(a, b Position) int { return a.Partition - b.Partition })
	return before, after, nil
}
