package kread

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
)

// Defaults of Config.
const (
	MinBytesDefault = 1
	MaxBytesDefault = 1 << 20
	MaxWaitDefault  = 500 * time.Millisecond
)

// Kafka's isolation levels in a Fetch request.
const (
	readUncommitted int8 = 0
	readCommitted   int8 = 1
)

// Config configures a Reader.
type Config struct {
	// Client sends the requests: its Addr (the bootstrap brokers), its
	// Transport (TLS, SASL; kafka.DefaultTransport when nil) and its Timeout
	// (per request; Fetch asks the broker to wait at most half of it) are
	// used. Required.
	Client *kafka.Client
	// Topic and Partition name the partition to read. Required.
	Topic     string
	Partition int
	// MinBytes is how many bytes the broker waits for (up to MaxWait)
	// before it answers. Defaults to MinBytesDefault.
	MinBytes int
	// MaxBytes bounds a response; the first batch is returned whole even
	// when it is larger. Defaults to MaxBytesDefault.
	MaxBytes int
	// MaxWait is how long the broker waits for MinBytes. Defaults to
	// MaxWaitDefault.
	MaxWait time.Duration
	// ReadUncommitted returns the records of aborted and open transactions
	// too (markers are still left out). Unsafe: a consumer would act on
	// data its producer rolled back. Defaults to false (committed data
	// only).
	ReadUncommitted bool
}

// Reader reads committed records of one partition, from an offset that
// each Fetch moves. It is not safe for concurrent use.
type Reader struct {
	cfg    Config
	offset int64
	// records is the array the last Fetch returned its records in, reused
	// by the next one (one allocation per fetch less, and no growth by
	// doubling): a fetch of many small messages allocated more for it
	// than for the messages themselves.
	records []kafka.Message
}

// keepRecords is the most records whose array a Reader keeps for the next
// Fetch; a larger one is left to the garbage collector, and so is one that
// the last fetch filled to less than a quarter (an idle partition's fetches
// return nothing: its reader keeps no array past one of them).
const keepRecords = 8192

// New returns a Reader of cfg's partition positioned at offset: an offset of
// the partition, kafka.FirstOffset (the log start) or kafka.LastOffset (the
// last stable offset, or the high watermark with ReadUncommitted), resolved
// by the first Fetch.
func New(cfg *Config, offset int64) (*Reader, error) {
	if cfg == nil || cfg.Client == nil {
		return nil, errors.New("kread: Config.Client is required")
	}
	if cfg.Client.Addr == nil {
		return nil, errors.New("kread: Config.Client.Addr is required")
	}
	if cfg.Topic == "" {
		return nil, errors.New("kread: Config.Topic is required")
	}
	if cfg.Partition < 0 {
		return nil, fmt.Errorf("kread: Config.Partition %d is negative", cfg.Partition)
	}
	if cfg.MinBytes < 0 || cfg.MaxBytes < 0 || cfg.MaxWait < 0 {
		return nil, errors.New("kread: MinBytes, MaxBytes and MaxWait must not be negative")
	}
	if err := checkOffset(offset); err != nil {
		return nil, err
	}
	c := *cfg
	c.MinBytes = cmp.Or(c.MinBytes, MinBytesDefault)
	c.MaxBytes = cmp.Or(c.MaxBytes, MaxBytesDefault)
	c.MaxWait = cmp.Or(c.MaxWait, MaxWaitDefault)
	return &Reader{cfg: c, offset: offset}, nil
}

func checkOffset(offset int64) error {
	if offset < 0 && offset != kafka.FirstOffset && offset != kafka.LastOffset {
		return fmt.Errorf("kread: offset %d is neither an offset nor kafka.FirstOffset or kafka.LastOffset", offset)
	}
	return nil
}

// Offset returns the offset the next Fetch reads from (kafka.FirstOffset or
// kafka.LastOffset until a Fetch resolved it).
func (r *Reader) Offset() int64 { return r.offset }

// SetOffset moves the reader to offset, which New accepts too; Fetch returns an
// error for any other negative value.
func (r *Reader) SetOffset(offset int64) { r.offset = offset }

// SetMaxBytes bounds the responses of the next fetches (Config.MaxBytes);
// n < 1 is taken as 1.
func (r *Reader) SetMaxBytes(n int) { r.cfg.MaxBytes = max(n, 1) }

// Fetch is what one Reader.Fetch returned.
type Fetch struct {
	// Records are the committed data records (or, with ReadUncommitted, all
	// data records) at or after the reader's offset, in offset order; often
	// none, for example when the fetch covered only markers or aborted
	// records. The slice is the reader's: the next Fetch reuses it (the
	// records' keys, values and headers are not reused).
	Records []kafka.Message
	// Next is the offset after everything the fetch covered, markers and
	// aborted records included; the reader moved there. It never passes
	// LastStable (HighWatermark with ReadUncommitted).
	Next int64
	// HighWatermark, LastStable and LogStart are the partition's high
	// watermark, last stable offset and log start offset, as the broker
	// answered.
	HighWatermark, LastStable, LogStart int64
}

// OffsetOutOfRangeError means the reader's offset is outside the
// partition's log: below the log start (records deleted by retention or a
// delete-records request) or past the high watermark (the topic was
// recreated, or the broker lost data). It matches kafka.OffsetOutOfRange.
type OffsetOutOfRangeError struct {
	Topic     string
	Partition int
	Offset    int64
}

func (e *OffsetOutOfRangeError) Error() string {
	return fmt.Sprintf("kread: %s/%d: offset %d is out of range", e.Topic, e.Partition, e.Offset)
}

// Unwrap returns kafka.OffsetOutOfRange.
func (e *OffsetOutOfRangeError) Unwrap() error { return kafka.OffsetOutOfRange }

// Fetch waits up to MaxWait for records at or after the reader's offset and
// returns them; the reader's offset moves to the returned Next. A fetch may
// return no record and still move the offset (over markers and aborted
// records). On error the offset does not move.
func (r *Reader) Fetch(ctx context.Context) (Fetch, error) {
	if err := r.resolve(ctx); err != nil {
		return Fetch{}, err
	}
	start := r.offset
	p, err := r.fetch(ctx, start, r.cfg.MinBytes, r.cfg.MaxBytes, r.cfg.MaxWait)
	if err != nil {
		return Fetch{}, err
	}
	f := Fetch{Next: start, HighWatermark: p.HighWatermark, LastStable: p.LastStableOffset, LogStart: p.LogStartOffset}
	limit := p.HighWatermark
	if !r.cfg.ReadUncommitted && p.LastStableOffset >= 0 {
		limit = min(limit, p.LastStableOffset)
	}
	flt := newFilter(r.cfg.Topic, r.cfg.Partition, start, limit, p.HighWatermark, !r.cfg.ReadUncommitted,
		p.AbortedTransactions)
	clear(r.records) // the last fetch's records: nothing keeps them alive through the reader
	flt.records = r.records[:0]
	err = flt.run(p.RecordSet.Records)
	r.records = nil
	if n := len(flt.records); n > 0 && cap(flt.records) <= min(keepRecords, 4*n) {
		r.records = flt.records
	}
	if err != nil {
		return Fetch{}, fmt.Errorf("kread: read %s/%d at %d: %w", r.cfg.Topic, r.cfg.Partition, start, err)
	}
	f.Records, f.Next = flt.records, flt.next
	if flt.batches > 0 && f.Next == start && start < limit {
		// The batch holding start has no record at or after it: compaction
		// removed its last records. Find where it ends.
		if f.Next, err = r.batchEnd(ctx, start, limit); err != nil {
			return Fetch{}, err
		}
	}
	r.offset = f.Next
	return f, nil
}

// resolve turns kafka.FirstOffset or kafka.LastOffset into an offset.
func (r *Reader) resolve(ctx context.Context) error {
	if err := checkOffset(r.offset); err != nil {
		return err
	}
	if r.offset >= 0 {
		return nil
	}
	level := kafka.ReadCommitted
	if r.cfg.ReadUncommitted {
		level = kafka.ReadUncommitted
	}
	res, err := r.cfg.Client.ListOffsets(ctx, &kafka.ListOffsetsRequest{IsolationLevel: level,
		Topics: map[string][]kafka.OffsetRequest{r.cfg.Topic: {{Partition: r.cfg.Partition, Timestamp: r.offset}}}})
	if err != nil {
		return err // connection errors, unchanged
	}
	for _, po := range res.Topics[r.cfg.Topic] {
		if po.Partition != r.cfg.Partition {
			continue
		}
		if po.Error != nil {
			return fmt.Errorf("kread: list offsets of %s/%d: %w", r.cfg.Topic, r.cfg.Partition, po.Error)
		}
		if r.offset == kafka.FirstOffset {
			r.offset = po.FirstOffset
		} else {
			r.offset = po.LastOffset
		}
		return nil
	}
	return fmt.Errorf("kread: list offsets of %s/%d: no answer for the partition", r.cfg.Topic, r.cfg.Partition)
}

// fetch sends one Fetch request for the reader's partition at offset to the
// partition's leader and returns the partition's part of the answer.
func (r *Reader) fetch(ctx context.Context, offset int64, minBytes, maxBytes int, maxWait time.Duration) (*fetchapi.ResponsePartition, error) {
	c := r.cfg.Client
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	// The broker's wait must end well before the request's deadline.
	if dl, ok := ctx.Deadline(); ok {
		maxWait = max(min(maxWait, time.Until(dl)/2), 0)
	}
	level := readCommitted
	if r.cfg.ReadUncommitted {
		level = readUncommitted
	}
	transport := c.Transport
	if transport == nil {
		transport = kafka.DefaultTransport
	}
	m, err := transport.RoundTrip(ctx, c.Addr, &fetchapi.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(maxWait / time.Millisecond),
		MinBytes:       int32(minBytes),
		MaxBytes:       int32(maxBytes),
		IsolationLevel: level,
		SessionID:      -1,
		SessionEpoch:   -1,
		Topics: []fetchapi.RequestTopic{{
			Topic: r.cfg.Topic,
			Partitions: []fetchapi.RequestPartition{{
				Partition:          int32(r.cfg.Partition),
				CurrentLeaderEpoch: -1,
				FetchOffset:        offset,
				LogStartOffset:     -1,
				PartitionMaxBytes:  int32(maxBytes),
			}},
		}},
	})
	if err != nil {
		if isRouteError(err) {
			return nil, r.routeError(ctx, fmt.Sprintf("fetch %s/%d at %d", r.cfg.Topic, r.cfg.Partition, offset), err)
		}
		return nil, err // connection errors, unchanged
	}
	res, ok := m.(*fetchapi.Response)
	if !ok {
		return nil, fmt.Errorf("kread: fetch %s/%d: unexpected response %T", r.cfg.Topic, r.cfg.Partition, m)
	}
	if res.ErrorCode != 0 {
		return nil, fmt.Errorf("kread: fetch %s/%d at %d: %w", r.cfg.Topic, r.cfg.Partition, offset, kafka.Error(res.ErrorCode))
	}
	for i := range res.Topics {
		t := &res.Topics[i]
		if t.Topic != r.cfg.Topic {
			continue
		}
		for j := range t.Partitions {
			p := &t.Partitions[j]
			if int(p.Partition) != r.cfg.Partition {
				continue
			}
			switch code := kafka.Error(p.ErrorCode); {
			case code == 0:
				return p, nil
			case code == kafka.OffsetOutOfRange:
				return nil, &OffsetOutOfRangeError{Topic: r.cfg.Topic, Partition: r.cfg.Partition, Offset: offset}
			default:
				return nil, fmt.Errorf("kread: fetch %s/%d at %d: %w", r.cfg.Topic, r.cfg.Partition, offset, code)
			}
		}
	}
	return nil, fmt.Errorf("kread: fetch %s/%d at %d: the answer does not name the partition", r.cfg.Topic, r.cfg.Partition, offset)
}

// isRouteError reports whether err is kafka-go's transport refusing to
// route a request: its cached metadata has no leader for the partition.
func isRouteError(err error) bool {
	return errors.Is(err, protocol.ErrNoTopic) || errors.Is(err, protocol.ErrNoPartition) ||
		errors.Is(err, protocol.ErrNoLeader)
}

// routeError explains a routing refusal of the transport. When the cluster
// could not be reached since the transport started, the transport says
// "topic not found" and keeps the real cause for metadata requests: kread
// asks for metadata and returns that connection error unchanged. Otherwise
// a topic or partition the metadata does not have is
// kafka.UnknownTopicOrPartition, and a partition without a leader (or
// metadata older than the partition) is kafka.LeaderNotAvailable, which
// callers wait out.
func (r *Reader) routeError(ctx context.Context, op string, err error) error {
	md, merr := r.cfg.Client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{r.cfg.Topic}})
	if merr != nil {
		return merr
	}
	code := kafka.UnknownTopicOrPartition
	for _, t := range md.Topics {
		if t.Name != r.cfg.Topic || t.Error != nil {
			continue
		}
		for _, p := range t.Partitions {
			if p.ID == r.cfg.Partition {
				code = kafka.LeaderNotAvailable
			}
		}
	}
	return fmt.Errorf("kread: %s: %w (%v)", op, code, err)
}

// batchEnd returns the offset after the batch that holds offset, when a
// fetch showed that batch but none of its records at or after offset and
// nothing after it: compaction removed the batch's last records, and Kafka
// kept its last offset in the batch header, which kafka-go does not decode.
// A fetch at o returns first the batch whose last offset is the first at or
// after o, so the batch ends at the smallest o (up to limit, which it does
// not pass) whose one-batch fetch starts after offset: a galloping search
// from offset, then a binary one, a few fetches of one batch each.
func (r *Reader) batchEnd(ctx context.Context, offset, limit int64) (int64, error) {
	inside := func(o int64) (bool, error) {
		p, err := r.fetch(ctx, o, 0, 1, 0)
		if err != nil {
			return false, err
		}
		base, ok := firstBase(p.RecordSet.Records)
		return ok && base <= offset, nil
	}
	lo, hi := offset, limit // the batch holds lo and ends at or before hi
	for step := int64(1); lo+step < hi; step *= 2 {
		in, err := inside(lo + step)
		if err != nil {
			return 0, err
		}
		if !in {
			hi = lo + step
			break
		}
		lo += step
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		in, err := inside(mid)
		if err != nil {
			return 0, err
		}
		if in {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi, nil
}

// firstBase returns the first offset of the first batch of rs.
func firstBase(rs protocol.RecordReader) (int64, bool) {
	for _, b := range batchesOf(rs) {
		if base, ok := baseOffset(b); ok {
			return base, true
		}
		rec, err := b.ReadRecord()
		if err != nil {
			return 0, false
		}
		closeRecord(rec)
		return rec.Offset, true
	}
	return 0, false
}
