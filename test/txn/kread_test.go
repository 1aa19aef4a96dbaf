package txn

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/kread"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/txproducer"
)

// mixedTopic writes, on three partitions, committed and aborted
// transactions of two Java producers (interleaved batch by batch on
// partition 1, one transaction over partitions 1 and 2) and non-transactional
// kafka-go records. It returns what a committed reader must return, and what
// an uncommitted one must.
func mixedTopic(t *testing.T, topic string, jc txproducer.Compression, kc kafka.Compression) (committed, all want) {
	t.Helper()
	jp := txproducer.Start(t, bootstrap(t))
	a, b := jp.Producer("", jc), jp.Producer("", jc)
	both := func(p int, offsets []int64, ids ...string) {
		committed.add(p, offsets, ids...)
		all.add(p, offsets, ids...)
	}

	// Partition 0: committed, aborted, non-transactional, committed.
	a.Begin()
	sendAll(a, topic, 0, "c1", "c2", "c3")
	both(0, a.Commit(), "c1", "c2", "c3")
	a.Begin()
	sendAll(a, topic, 0, "a1", "a2", "a3")
	all.add(0, a.Abort(), "a1", "a2", "a3")
	both(0, produce(t, topic, 0, kc, "n1", "n2"), "n1", "n2")
	a.Begin()
	sendAll(a, topic, 0, "c4")
	both(0, a.Commit(), "c4")

	// Partition 1: two transactions interleaved batch by batch with a
	// non-transactional batch between; a's aborts, b's commits.
	a.Begin()
	b.Begin()
	sendAll(a, topic, 1, "x1", "x2")
	all.add(1, a.Flush(), "x1", "x2")
	sendAll(b, topic, 1, "y1")
	both(1, b.Flush(), "y1")
	both(1, produce(t, topic, 1, kc, "n3"), "n3")
	sendAll(a, topic, 1, "x3")
	all.add(1, a.Flush(), "x3")
	sendAll(b, topic, 1, "y2", "y3")
	both(1, b.Flush(), "y2", "y3")
	a.Abort()
	b.Commit()

	// Partitions 1 and 2: a's transaction over both commits, b's aborts.
	a.Begin()
	b.Begin()
	sendAll(b, topic, 1, "y4")
	all.add(1, b.Flush(), "y4")
	sendAll(a, topic, 1, "x4")
	sendAll(a, topic, 2, "x5", "x6")
	off := a.Flush()
	both(1, off[:1], "x4")
	both(2, off[1:], "x5", "x6")
	sendAll(b, topic, 2, "y5")
	all.add(2, b.Flush(), "y5")
	b.Abort()
	a.Commit()

	// Partition 2 ends with an aborted transaction: its records and marker
	// are the last offsets of the log.
	both(2, produce(t, topic, 2, kc, "n4", "n5", "n6"), "n4", "n5", "n6")
	a.Begin()
	sendAll(a, topic, 2, "a4", "a5")
	all.add(2, a.Abort(), "a4", "a5")
	return committed, all
}

// checkPartitions reads each partition of topic from its start with cfg
// tuned by tune, and checks that exactly the records of w come back and
// that the reader ends at the log end.
func checkPartitions(t *testing.T, topic string, partitions int, w want, tune func(*kread.Config)) {
	t.Helper()
	var got []rec
	for p := range partitions {
		b := stableBounds(t, topic, p)
		r := newReader(t, topic, p, kafka.FirstOffset, tune)
		msgs, last := readTo(t, r, b.hw)
		got = append(got, recsOf(t, msgs)...)
		if last.Next != b.hw || last.HighWatermark != b.hw || last.LastStable != b.hw || last.LogStart != b.start {
			t.Fatalf("partition %d: last fetch %+v, want Next = HighWatermark = LastStable = %d, LogStart %d",
				p, last, b.hw, b.start)
		}
		// At the end, a fetch waits, returns nothing and stays there.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		f, err := r.Fetch(ctx)
		cancel()
		if err != nil || len(f.Records) != 0 || f.Next != b.hw {
			t.Fatalf("partition %d: fetch at the end: %d records, Next %d, err %v; want none, %d", p, len(f.Records), f.Next, err, b.hw)
		}
	}
	equalRecs(t, "records read", got, w.sorted())
}

// TestCommittedOnly: from a topic with committed, aborted and interleaved
// transactions and non-transactional records, kread returns exactly the
// committed and non-transactional records, no marker and no aborted record,
// and ends at the log end, whatever the fetch size.
func TestCommittedOnly(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 3)
	committed, all := mixedTopic(t, topic, txproducer.None, 0)

	t.Run("default", func(t *testing.T) { checkPartitions(t, topic, 3, committed, nil) })
	// One batch per fetch: aborted transactions and markers span fetches.
	t.Run("one batch per fetch", func(t *testing.T) {
		checkPartitions(t, topic, 3, committed, func(c *kread.Config) { c.MaxBytes = 1 })
	})
	// ReadUncommitted returns aborted records too, never a marker.
	t.Run("uncommitted", func(t *testing.T) {
		checkPartitions(t, topic, 3, all, func(c *kread.Config) { c.ReadUncommitted = true })
	})
	// From every offset, markers and aborted records included, a reader
	// returns the committed records at and after it.
	t.Run("every start", func(t *testing.T) {
		for p := range 3 {
			b := stableBounds(t, topic, p)
			for start := b.start; start <= b.hw; start++ {
				var w []rec
				for _, r := range committed.sorted() {
					if r.Partition == p && r.Offset >= start {
						w = append(w, r)
					}
				}
				for _, maxBytes := range []int{1, 0} {
					r := newReader(t, topic, p, start, func(c *kread.Config) { c.MaxBytes = maxBytes })
					msgs, _ := readTo(t, r, b.hw)
					equalRecs(t, fmt.Sprintf("partition %d from %d, MaxBytes %d", p, start, maxBytes), recsOf(t, msgs), w)
				}
			}
		}
	})
}

// TestCompression: the same, with every codec on both producers (Java
// compression.type and kafka-go's batch compression).
func TestCompression(t *testing.T) {
	t.Parallel()
	codecs := []struct {
		java txproducer.Compression
		kgo  kafka.Compression
	}{
		{txproducer.Gzip, kafka.Gzip}, {txproducer.Snappy, kafka.Snappy},
		{txproducer.Lz4, kafka.Lz4}, {txproducer.Zstd, kafka.Zstd},
	}
	for _, c := range codecs {
		t.Run(string(c.java), func(t *testing.T) {
			t.Parallel()
			topic := testenv.NewTopic(t, 3)
			committed, _ := mixedTopic(t, topic, c.java, c.kgo)
			checkPartitions(t, topic, 3, committed, nil)
			checkPartitions(t, topic, 3, committed, func(c *kread.Config) { c.MaxBytes = 1 })
		})
	}
}

// TestOpenTransaction: a transaction left open holds the reader at the last
// stable offset, with the committed and non-transactional records written
// after it, until it ends: on commit its records and the held ones come, on
// abort only the held ones.
func TestOpenTransaction(t *testing.T) {
	t.Parallel()
	for _, commit := range []bool{true, false} {
		t.Run(map[bool]string{true: "commit", false: "abort"}[commit], func(t *testing.T) {
			t.Parallel()
			topic := testenv.NewTopic(t, 1)
			jp := txproducer.Start(t, bootstrap(t))
			open, other := jp.Producer("", txproducer.None), jp.Producer("", txproducer.None)
			var before, held, opened want
			before.add(0, produce(t, topic, 0, 0, "n1"), "n1")
			open.Begin()
			sendAll(open, topic, 0, "h1", "h2")
			hOff := open.Flush()
			opened.add(0, hOff, "h1", "h2")
			held.add(0, produce(t, topic, 0, 0, "n2"), "n2")
			other.Begin()
			sendAll(other, topic, 0, "o1")
			oOff := other.Commit()
			held.add(0, oOff, "o1")

			// The commit marker follows o1, written after Commit returned.
			b := partitionBounds(t, topic, 0)
			for deadline := time.Now().Add(time.Minute); b.hw != oOff[0]+2; b = partitionBounds(t, topic, 0) {
				if time.Now().After(deadline) {
					t.Fatalf("high watermark %d, want %d after the commit marker", b.hw, oOff[0]+2)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if b.lso != hOff[0] {
				t.Fatalf("last stable offset %d, want the open transaction's first offset %d", b.lso, hOff[0])
			}
			r := newReader(t, topic, 0, kafka.FirstOffset, nil)
			msgs, last := readTo(t, r, b.lso)
			equalRecs(t, "before the open transaction", recsOf(t, msgs), before.sorted())
			if last.LastStable != hOff[0] || last.HighWatermark != b.hw {
				t.Fatalf("fetch %+v: want LastStable %d, HighWatermark %d", last, hOff[0], b.hw)
			}
			// Held: fetches return nothing and stay at the last stable offset.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for range 3 {
				f, err := r.Fetch(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if len(f.Records) != 0 || f.Next != hOff[0] {
					t.Fatalf("while the transaction is open: %v, Next %d; want nothing, %d", recsOf(t, f.Records), f.Next, hOff[0])
				}
			}

			var after want
			after = append(after, held...)
			if commit {
				open.Commit()
				after = append(after, opened...)
			} else {
				open.Abort()
			}
			b = stableBounds(t, topic, 0)
			msgs, last = readTo(t, r, b.hw)
			equalRecs(t, "after the transaction ended", recsOf(t, msgs), after.sorted())
			if last.Next != b.hw {
				t.Fatalf("Next %d, bounds %+v: want the log end", last.Next, b)
			}
		})
	}
}

// TestOffsetOutOfRange: an offset past the log end is an
// *kread.OffsetOutOfRangeError, and the reader does not move.
func TestOffsetOutOfRange(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 1)
	produce(t, topic, 0, 0, "n1", "n2")
	r := newReader(t, topic, 0, 5, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := r.Fetch(ctx)
	var oor *kread.OffsetOutOfRangeError
	if !errors.As(err, &oor) || !errors.Is(err, kafka.OffsetOutOfRange) || oor.Offset != 5 || oor.Topic != topic {
		t.Fatalf("fetch at 5 of 2 records: %v, want an OffsetOutOfRangeError for offset 5", err)
	}
	if r.Offset() != 5 {
		t.Fatalf("reader moved to %d on error", r.Offset())
	}
	r.SetOffset(kafka.LastOffset)
	f, err := r.Fetch(ctx)
	if err != nil || f.Next != 2 || len(f.Records) != 0 {
		t.Fatalf("fetch at the end: %+v, %v; want nothing and Next 2", f, err)
	}
}
