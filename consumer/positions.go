package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/kafkaoffsets"
)

// ErrTopicRecreated means a partition's stored position does not belong to
// the topic Kafka has now: the position is past the partition's log end, or
// the record just before it is not the one the consumer passed. Either the
// topic was deleted and created again under the same name, or the broker
// lost data. Errors returned for it are *PositionError.
var ErrTopicRecreated = errors.New("consumer: stored position does not match the topic")

// ErrMessagesLost means messages of a partition were deleted from Kafka
// (retention, or a deleted-records request) before this consumer processed
// them: its position is below the partition's log start. The runner reports
// the lost range (ERROR log, PositionObserver) and continues at the log
// start; nothing can bring those messages back.
var ErrMessagesLost = errors.New("consumer: messages deleted before they were processed")

// PositionError describes a partition whose stored position could not be
// used as it is. It matches ErrTopicRecreated or ErrMessagesLost.
type PositionError struct {
	Topic     string
	Partition int
	// Position is the stored position (the next offset to process).
	Position int64
	// LogStart and LogEnd are the partition's first offset and the offset
	// after its last record, as Kafka reported them.
	LogStart, LogEnd int64
	// Reason says what was found, in words.
	Reason string
	// Group and Name are the runner's consumer group and dedup name, for
	// the command that resolves the error.
	Group, Name string

	kind error // ErrTopicRecreated or ErrMessagesLost
}

func (e *PositionError) Error() string {
	if e.kind == ErrMessagesLost {
		return fmt.Sprintf("consumer: topic %s partition %d: messages at offsets [%d, %d) were deleted by Kafka before they were processed (stored position %d, log start %d)",
			e.Topic, e.Partition, e.Position, e.LogStart, e.Position, e.LogStart)
	}
	return fmt.Sprintf("consumer: topic %s partition %d: stored position %d does not match the topic (log start %d, log end %d): %s. "+
		"The topic was deleted and created again, or the broker lost data; nothing was consumed from this partition. "+
		"To move the consumer onto the topic as it is now, run `idemkit consumer seek -group %s -name %s -topic %s -to-earliest -recreated` "+
		"with the consumer stopped, or set Config.OnRecreated to RecreatedRestart",
		e.Topic, e.Partition, e.Position, e.LogStart, e.LogEnd, e.Reason, e.Group, e.Name, e.Topic)
}

// Is matches ErrTopicRecreated or ErrMessagesLost.
func (e *PositionError) Is(target error) bool { return target == e.kind }

// RecreatedPolicy says what a runner does with a partition whose stored
// position does not match the topic (ErrTopicRecreated).
type RecreatedPolicy int

const (
	// RecreatedStop stops the runner: Run returns the *PositionError, which
	// names the partition and the command that moves the consumer on. This
	// is the default: a position that does not match may mean lost data, and
	// an operator should look before anything is consumed.
	RecreatedStop RecreatedPolicy = iota
	// RecreatedRestart starts the partition over at its log start, as a new
	// incarnation of the topic (Message.Incarnation increases, so IDs made
	// from coordinates and dead-letter replay records do not collide with
	// the old topic's), with an ERROR log and PositionObserver. Messages
	// whose IDs were processed before are still deduplicated.
	RecreatedRestart
)

// partitionStart is where one partition starts and with which incarnation.
type partitionStart struct {
	offset      int64
	incarnation int64
	epoch       int64 // of the position as read: position writes require it
	// commit is set when the start should be committed to Kafka at once:
	// the PostgreSQL position is ahead of Kafka's committed offset.
	commit bool
}

// recordTime reads the timestamp of the record at offset. ok is false when
// no record has that offset (compacted away, or a transaction marker).
func recordTime(ctx context.Context, client *kafka.Client, topic string, partition int, offset int64) (t time.Time, ok bool, err error) {
	// One byte is enough: Kafka returns the first record batch whole.
	res, err := client.Fetch(ctx, &kafka.FetchRequest{Topic: topic, Partition: partition, Offset: offset,
		MinBytes: 1, MaxBytes: 1, MaxWait: 100 * time.Millisecond})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, offset, err)
	}
	if res.Error != nil {
		if errors.Is(res.Error, kafka.OffsetOutOfRange) {
			return time.Time{}, false, nil
		}
		return time.Time{}, false, fmt.Errorf("fetch %s/%d at %d: %w", topic, partition, offset, res.Error)
	}
	for {
		rec, err := res.Records.ReadRecord()
		if errors.Is(err, io.EOF) {
			return time.Time{}, false, nil
		}
		if err != nil {
			return time.Time{}, false, fmt.Errorf("read %s/%d at %d: %w", topic, partition, offset, err)
		}
		if rec.Value != nil {
			_ = rec.Value.Close()
		}
		if rec.Key != nil {
			_ = rec.Key.Close()
		}
		switch {
		case rec.Offset < offset:
			continue
		case rec.Offset == offset:
			return rec.Time, true, nil
		default:
			return time.Time{}, false, nil
		}
	}
}

// sameInstant compares a Kafka timestamp (milliseconds) with one stored in
// PostgreSQL (microseconds).
func sameInstant(a, b time.Time) bool { return a.UnixMilli() == b.UnixMilli() }

// checkStart decides where partition starts from the stored position, Kafka's
// committed offset (kafkaNext, negative when none) and the partition's log
// range. It returns a *PositionError matching ErrTopicRecreated when the
// position does not match the topic and the policy is RecreatedStop.
func (r *Runner) checkStart(ctx context.Context, client *kafka.Client, partition int, pos dedup.Position, havePos bool,
	kafkaNext int64, lr kafkaoffsets.Range) (partitionStart, error) {
	cfg := &r.cfg
	log := cfg.Logger.With("topic", cfg.Topic, "group", cfg.GroupID, "partition", partition)
	perr := func(kind error, reason string) *PositionError {
		return &PositionError{Topic: cfg.Topic, Partition: partition, Position: pos.Next, LogStart: lr.Start, LogEnd: lr.End,
			Reason: reason, Group: cfg.GroupID, Name: cfg.Name, kind: kind}
	}
	start := partitionStart{offset: cfg.StartOffset, incarnation: pos.Incarnation, epoch: pos.Epoch}
	source := "the configured start offset"
	if kafkaNext >= 0 {
		start.offset, source = kafkaNext, "Kafka's committed offset"
	}
	fromPG := havePos && (kafkaNext < 0 || pos.Next >= kafkaNext)
	if fromPG {
		start.offset, source = pos.Next, "the PostgreSQL position"
		start.commit = pos.Next > kafkaNext
	}
	if start.offset < 0 {
		return start, nil // kafka.FirstOffset or kafka.LastOffset: nothing to check
	}
	var mismatch *PositionError
	switch {
	case start.offset > lr.End:
		mismatch = perr(ErrTopicRecreated, fmt.Sprintf("%s %d is past the log end %d", source, start.offset, lr.End))
		mismatch.Position = start.offset
	case fromPG && !pos.AnchorTime.IsZero() && pos.AnchorOffset >= lr.Start && pos.AnchorOffset < lr.End:
		t, ok, err := recordTime(ctx, client, cfg.Topic, partition, pos.AnchorOffset)
		if err != nil {
			return start, err
		}
		if ok && !sameInstant(t, pos.AnchorTime) {
			mismatch = perr(ErrTopicRecreated, fmt.Sprintf("the record at offset %d has timestamp %s, the one this consumer passed had %s",
				pos.AnchorOffset, t.UTC().Format(time.RFC3339Nano), pos.AnchorTime.UTC().Format(time.RFC3339Nano)))
		}
	}
	if mismatch != nil {
		if cfg.OnRecreated != RecreatedRestart {
			log.Error("stored position does not match the topic; stopping", "err", mismatch)
			return start, mismatch
		}
		inc, epoch, err := r.resetPosition(ctx, partition, lr.Start)
		if err != nil {
			return start, err
		}
		log.Error("stored position does not match the topic; starting over at the log start as a new incarnation",
			"position", mismatch.Position, "log_start", lr.Start, "log_end", lr.End, "incarnation", inc, "reason", mismatch.Reason)
		r.obs.positionMoved(ctx, mismatch)
		return partitionStart{offset: lr.Start, incarnation: inc, epoch: epoch, commit: true}, nil
	}
	if start.offset < lr.Start {
		lost := perr(ErrMessagesLost, "")
		lost.Position = start.offset
		log.Error("messages were deleted by Kafka before this consumer processed them; continuing at the log start",
			"from", start.offset, "to", lr.Start, "lost", lr.Start-start.offset, "source", source)
		r.obs.positionMoved(ctx, lost)
		start.offset, start.commit = lr.Start, true
	}
	return start, nil
}

// resetPosition moves partition's position to next as a new incarnation.
func (r *Runner) resetPosition(ctx context.Context, partition int, next int64) (incarnation, epoch int64, err error) {
	err = inTx(ctx, r.cfg.pool, 0, func(ctx context.Context, tx pgx.Tx) error {
		_, after, err := r.cfg.Store.SeekTx(ctx, tx, r.cfg.Name, r.cfg.Topic, map[int]int64{partition: next}, true)
		if err == nil {
			incarnation, epoch = after[0].Incarnation, after[0].Epoch
		}
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("consumer: reset position of partition %d: %w", partition, err)
	}
	return incarnation, epoch, nil
}
