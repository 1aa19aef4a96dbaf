package kread

import (
	"errors"
	"io"
	"slices"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
)

// controlAbort is the type of an abort marker's control record (Kafka's
// ControlRecordType.ABORT); COMMIT is 1.
const controlAbort = 0

// filter walks the batches of one fetch response and keeps the records a
// read_committed consumer sees, as Kafka's CompletedFetch does:
//
//   - control batches (transaction markers) are never returned;
//   - with committed set, before a batch with a producer ID is looked at,
//     every aborted transaction of the response that starts at or before
//     the batch is taken from the queue (ordered by first offset) and its
//     producer becomes aborted; an abort marker of a producer ends that;
//     a transactional batch of an aborted producer is skipped whole.
//
// Kafka compares the transactions' first offsets with the batch's last
// offset; kafka-go does not decode it, and the batch's base offset gives
// the same answer: a transaction's first offset is the base offset of its
// first batch, and batches do not overlap, so it is at or before a batch's
// last offset exactly when it is at or before the batch's base offset.
type filter struct {
	topic     string
	partition int
	// start is the fetch offset: records before it are left out.
	start int64
	// limit is the last stable offset (the high watermark with
	// committed unset): nothing at or past it is returned or covered.
	limit     int64
	hw        int64
	committed bool

	aborted          []fetchapi.ResponseTransaction // not yet reached, by first offset
	abortedProducers map[int64]bool

	// next is the offset after everything covered so far; batches counts
	// the batches met before limit.
	next    int64
	batches int
	records []kafka.Message
}

func newFilter(topic string, partition int, start, limit, hw int64, committed bool,
	aborted []fetchapi.ResponseTransaction) *filter {
	f := &filter{topic: topic, partition: partition, start: start, limit: limit, hw: hw, committed: committed,
		abortedProducers: map[int64]bool{}, next: start}
	if committed {
		f.aborted = slices.Clone(aborted)
		slices.SortStableFunc(f.aborted, func(a, b fetchapi.ResponseTransaction) int {
			return cmpInt64(a.FirstOffset, b.FirstOffset)
		})
	}
	return f
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// batchesOf returns the batches of a fetched record set.
func batchesOf(rs protocol.RecordReader) []protocol.RecordReader {
	switch rs := rs.(type) {
	case nil:
		return nil
	case *protocol.RecordStream:
		return rs.Records
	default:
		return []protocol.RecordReader{rs}
	}
}

// baseOffset returns the base offset of a v2 batch (data or control); v0
// and v1 message sets have none.
func baseOffset(b protocol.RecordReader) (int64, bool) {
	switch b := b.(type) {
	case *protocol.RecordBatch:
		return b.BaseOffset, true
	case *protocol.ControlBatch:
		return b.BaseOffset, true
	}
	return 0, false
}

func closeRecord(rec *protocol.Record) {
	if rec.Key != nil {
		_ = rec.Key.Close()
	}
	if rec.Value != nil {
		_ = rec.Value.Close()
	}
}

// run filters the record set of one response.
func (f *filter) run(rs protocol.RecordReader) error {
	for _, b := range batchesOf(rs) {
		done, err := f.batch(b)
		if err != nil || done {
			return err
		}
	}
	return nil
}

// batch filters one batch; done means limit was reached.
func (f *filter) batch(b protocol.RecordReader) (done bool, err error) {
	var (
		producer = int64(-1)
		control  bool
		skip     bool // the batch's records are not returned
	)
	if base, ok := baseOffset(b); ok {
		if base >= f.limit {
			f.next = max(f.next, f.limit)
			return true, nil
		}
		// Offsets between the end of the previous batch and this one hold
		// no record (compaction, or before the fetch offset).
		f.next = max(f.next, base)
		switch b := b.(type) {
		case *protocol.RecordBatch:
			producer = b.ProducerID
			skip = f.abortedBefore(base, producer) && b.Attributes.Transactional()
		case *protocol.ControlBatch:
			producer, control, skip = b.ProducerID, true, true
			f.abortedBefore(base, producer)
		}
	}
	f.batches++
	for first := true; ; first = false {
		rec, err := b.ReadRecord()
		if errors.Is(err, io.EOF) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		off := rec.Offset
		switch {
		case control && first && f.committed && producer >= 0:
			cr, err := protocol.ReadControlRecord(rec) // closes the record
			if err != nil {
				return false, err
			}
			if cr.Type == controlAbort {
				delete(f.abortedProducers, producer)
			}
		case skip, off < f.next, off >= f.limit:
			closeRecord(rec)
		default:
			m, err := f.message(rec)
			if err != nil {
				return false, err
			}
			f.records = append(f.records, m)
		}
		switch {
		case off >= f.limit:
			f.next = f.limit
			return true, nil
		case off >= f.next:
			f.next = off + 1
		}
	}
}

// abortedBefore takes from the queue the aborted transactions that start at
// or before offset, marks their producers aborted, and reports whether
// producer is aborted.
func (f *filter) abortedBefore(offset, producer int64) bool {
	if !f.committed || producer < 0 {
		return false
	}
	for len(f.aborted) > 0 && f.aborted[0].FirstOffset <= offset {
		f.abortedProducers[f.aborted[0].ProducerID] = true
		f.aborted = f.aborted[1:]
	}
	return f.abortedProducers[producer]
}

// message copies rec into a kafka.Message and closes it. The key and the
// value share one allocation (each capped, so that appending to one never
// writes over the other). The headers are rec's own: kafka-go decodes them
// into a slice and values allocated for this record alone, which nothing
// reuses (TestRecordsArrayReused reads a header after the next fetch).
func (f *filter) message(rec *protocol.Record) (kafka.Message, error) {
	defer closeRecord(rec)
	m := kafka.Message{Topic: f.topic, Partition: f.partition, Offset: rec.Offset, HighWaterMark: f.hw, Time: rec.Time,
		Headers: rec.Headers}
	var kn, vn int
	if rec.Key != nil {
		kn = rec.Key.Len()
	}
	if rec.Value != nil {
		vn = rec.Value.Len()
	}
	buf := make([]byte, kn+vn)
	if rec.Key != nil {
		m.Key = buf[:kn:kn]
		if _, err := io.ReadFull(rec.Key, m.Key); err != nil {
			return m, err
		}
	}
	if rec.Value != nil {
		m.Value = buf[kn : kn+vn : kn+vn]
		if _, err := io.ReadFull(rec.Value, m.Value); err != nil {
			return m, err
		}
	}
	return m, nil
}
