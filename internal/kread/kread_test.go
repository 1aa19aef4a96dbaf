package kread_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/kread"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

// Transactional topics need Kafka's Java producer: their tests are in the
// test module (test/txn). These cover the rest against the test broker.

func TestMain(m *testing.M) { testenv.Main(m, nil) }

func TestNewValidates(t *testing.T) {
	t.Parallel()
	client := &kafka.Client{Addr: kafka.TCP("127.0.0.1:9092")}
	for _, tc := range []struct {
		name   string
		cfg    *kread.Config
		offset int64
	}{
		{"nil config", nil, 0},
		{"no client", &kread.Config{Topic: "t"}, 0},
		{"no address", &kread.Config{Client: &kafka.Client{}, Topic: "t"}, 0},
		{"no topic", &kread.Config{Client: client}, 0},
		{"negative partition", &kread.Config{Client: client, Topic: "t", Partition: -1}, 0},
		{"negative MaxBytes", &kread.Config{Client: client, Topic: "t", MaxBytes: -1}, 0},
		{"negative offset", &kread.Config{Client: client, Topic: "t"}, -3},
	} {
		if _, err := kread.New(tc.cfg, tc.offset); err == nil {
			t.Errorf("%s: New returned no error", tc.name)
		}
	}
	for _, off := range []int64{0, 7, kafka.FirstOffset, kafka.LastOffset} {
		r, err := kread.New(&kread.Config{Client: client, Topic: "t"}, off)
		if err != nil || r.Offset() != off {
			t.Errorf("New at %d: %v, offset %d", off, err, r.Offset())
		}
	}
}

// produce writes n records to partition 0 of topic as one batch with
// compression c and returns the first offset.
func produce(t *testing.T, topic string, c kafka.Compression, from, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var res *kafka.ProduceResponse
	for {
		// Records made for each attempt: an attempt reads their keys and
		// values to the end.
		recs := make([]kafka.Record, n)
		for i := range recs {
			id := strconv.Itoa(from + i)
			recs[i] = kafka.Record{Key: kafka.NewBytes([]byte("k" + id)), Value: kafka.NewBytes([]byte("v" + id)),
				Time:    time.UnixMilli(int64(1_700_000_000_000 + from + i)),
				Headers: []kafka.Header{{Key: "message-id", Value: []byte("m" + id)}, {Key: "empty"}}}
		}
		var err error
		res, err = testenv.Client(t).Produce(ctx, &kafka.ProduceRequest{Topic: topic, RequiredAcks: kafka.RequireAll,
			Compression: c, Records: kafka.NewRecordReader(recs...)})
		if err == nil {
			err = res.Error
		}
		if err == nil {
			break
		}
		// A topic just created may be announced with its leader before
		// that broker leads it (CI met this once): wait for it.
		if !errors.Is(err, kafka.NotLeaderForPartition) && !errors.Is(err, kafka.LeaderNotAvailable) || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if res.BaseOffset != int64(from) {
		t.Fatalf("batch at %d, want %d", res.BaseOffset, from)
	}
}

// TestNonTransactional: records written outside transactions, in several
// batches with every codec, come back whole and in order, from any start,
// and the reader ends at the log end.
func TestNonTransactional(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 1)
	n := 0
	for _, c := range []kafka.Compression{0, kafka.Gzip, kafka.Snappy, kafka.Lz4, kafka.Zstd} {
		produce(t, topic, c, n, 5)
		n += 5
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, maxBytes := range []int{1, 0} {
		for _, start := range []int64{kafka.FirstOffset, 3, 7, int64(n)} {
			for _, uncommitted := range []bool{false, true} {
				name := fmt.Sprintf("MaxBytes %d, from %d, uncommitted %v", maxBytes, start, uncommitted)
				r, err := kread.New(&kread.Config{Client: testenv.Client(t), Topic: topic, MaxBytes: maxBytes,
					MaxWait: 50 * time.Millisecond, ReadUncommitted: uncommitted}, start)
				if err != nil {
					t.Fatal(err)
				}
				next := max(start, 0)
				for r.Offset() < int64(n) || r.Offset() < 0 {
					f, err := r.Fetch(ctx)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					if f.HighWatermark != int64(n) || f.LastStable != int64(n) || f.LogStart != 0 {
						t.Fatalf("%s: fetch %+v, want high watermark and last stable %d, log start 0", name, f, n)
					}
					for _, m := range f.Records {
						id := strconv.FormatInt(next, 10)
						if m.Offset != next || m.Topic != topic || m.Partition != 0 || m.HighWaterMark != int64(n) ||
							string(m.Key) != "k"+id || string(m.Value) != "v"+id ||
							m.Time.UnixMilli() != 1_700_000_000_000+next || len(m.Headers) != 2 ||
							string(m.Headers[0].Value) != "m"+id || m.Headers[1].Key != "empty" {
							t.Fatalf("%s: record %+v, want offset %d", name, m, next)
						}
						next++
					}
					if f.Next != next || r.Offset() != next {
						t.Fatalf("%s: Next %d, reader at %d, want %d", name, f.Next, r.Offset(), next)
					}
				}
				if next != int64(n) {
					t.Fatalf("%s: ended at %d, want %d", name, next, n)
				}
			}
		}
	}
	// kafka.LastOffset starts at the end.
	r, err := kread.New(&kread.Config{Client: testenv.Client(t), Topic: topic, MaxWait: 50 * time.Millisecond}, kafka.LastOffset)
	if err != nil {
		t.Fatal(err)
	}
	if f, err := r.Fetch(ctx); err != nil || len(f.Records) != 0 || f.Next != int64(n) {
		t.Fatalf("from kafka.LastOffset: %+v, %v; want nothing, Next %d", f, err, n)
	}
}

// TestConnectionErrorUnchanged: a broker that cannot be reached gives the
// transport's own error, which retry.IsConnection recognises.
func TestConnectionErrorUnchanged(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	transport := &kafka.Transport{DialTimeout: time.Second}
	defer transport.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(addr), Transport: transport}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// At an offset (a Fetch) and at kafka.FirstOffset (a ListOffsets first).
	for _, start := range []int64{0, kafka.FirstOffset} {
		r, err := kread.New(&kread.Config{Client: client, Topic: "t"}, start)
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Fetch(ctx)
		var opErr *net.OpError
		if !errors.As(err, &opErr) || !retry.IsConnection(err) {
			t.Fatalf("fetch at %d from a closed port: %T %v; want the dial error", start, err, err)
		}
		if r.Offset() != start {
			t.Fatalf("reader moved to %d", r.Offset())
		}
	}
}

// TestUnknownTopic: a topic that does not exist is
// kafka.UnknownTopicOrPartition, not a connection error.
func TestUnknownTopic(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, start := range []int64{0, kafka.LastOffset} {
		r, err := kread.New(&kread.Config{Client: testenv.Client(t), Topic: testenv.Name(t, "missing")}, start)
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Fetch(ctx)
		if !errors.Is(err, kafka.UnknownTopicOrPartition) || retry.IsConnection(err) {
			t.Fatalf("fetch at %d of a missing topic: %v; want kafka.UnknownTopicOrPartition", start, err)
		}
	}
}

// TestFetchEndsWithContext: a fetch that waits for records ends when its
// context does.
func TestFetchEndsWithContext(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 1)
	produce(t, topic, 0, 0, 1)
	r, err := kread.New(&kread.Config{Client: testenv.Client(t), Topic: topic, MaxWait: 20 * time.Second}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if f, err := r.Fetch(ctx); err != nil || f.Next != 1 {
		t.Fatalf("fetch: %+v, %v", f, err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err = r.Fetch(ctx)
	if !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("fetch: %v after %s; want context.Canceled soon after 200ms", err, time.Since(start))
	}
}

// TestRecordsArrayReused: a Fetch reuses the array the one before returned
// its records in (which the contract allows), and a record copied out of it
// keeps its key, value and headers, which are never reused; its key and
// value do not overlap. A fetch that returns nothing drops the array.
func TestRecordsArrayReused(t *testing.T) {
	t.Parallel()
	topic := testenv.NewTopic(t, 1)
	produce(t, topic, 0, 0, 3)
	produce(t, topic, 0, 3, 3)
	// MaxBytes 1: one batch (three records) per fetch.
	r, err := kread.New(&kread.Config{Client: testenv.Client(t), Topic: topic, MaxBytes: 1, MaxWait: 50 * time.Millisecond}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := r.Fetch(ctx)
	if err != nil || len(first.Records) != 3 {
		t.Fatalf("first fetch: %d records, %v; want 3", len(first.Records), err)
	}
	kept := first.Records[0] // a copy: its slices are the record's own
	second, err := r.Fetch(ctx)
	if err != nil || len(second.Records) != 3 || second.Records[0].Offset != 3 {
		t.Fatalf("second fetch: %+v, %v; want records 3 to 5", second.Records, err)
	}
	if &first.Records[0] != &second.Records[0] {
		t.Error("the second fetch allocated a new array for its records")
	}
	if kept.Offset != 0 || string(kept.Key) != "k0" || string(kept.Value) != "v0" || string(kept.Headers[0].Value) != "m0" {
		t.Errorf("a record copied from the first fetch changed: %+v", kept)
	}
	// The key and the value share an allocation: appending to the key
	// must not write over the value.
	_ = append(kept.Key, "xx"...)
	if string(kept.Value) != "v0" {
		t.Errorf("appending to the key changed the value to %q", kept.Value)
	}
	// A fetch that returns nothing (an idle partition) lets the array go.
	if idle, err := r.Fetch(ctx); err != nil || len(idle.Records) != 0 {
		t.Fatalf("fetch at the end: %+v, %v; want no record", idle.Records, err)
	}
	produce(t, topic, 0, 6, 3)
	third, err := r.Fetch(ctx)
	if err != nil || len(third.Records) != 3 || third.Records[0].Offset != 6 {
		t.Fatalf("third fetch: %+v, %v; want records 6 to 8", third.Records, err)
	}
	if &third.Records[0] == &first.Records[0] {
		t.Error("the reader kept its array through a fetch that returned nothing")
	}
}
