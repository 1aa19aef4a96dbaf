// Package txn tests idemkit's reading of topics written by transactional
// producers (Kafka's Java producer with transactional.id, through
// txproducer) against a real broker: internal/kread returns committed data
// only, internal/topicscan (dlq.Scan, the reprocessor, the CLI) reads
// through it, and kafka-go's Reader does not.
package txn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/kread"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/test/internal/containers"
	"github.com/idemkit/idemkit/test/internal/txproducer"
)

func TestMain(m *testing.M) {
	// The crash tests run this same binary as the consumer process they kill.
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	testenv.Main(m, containers.Start)
}

// bootstrap is the brokers as Java's bootstrap.servers.
func bootstrap(t *testing.T) string { return strings.Join(testenv.Brokers(t), ",") }

// rec is a record a reader should return: where it is and its message ID.
type rec struct {
	Partition int
	Offset    int64
	ID        string
}

func (r rec) String() string { return fmt.Sprintf("%d/%d:%s", r.Partition, r.Offset, r.ID) }

// want collects the records a committed reader must return.
type want []rec

// add records ids at offsets (as a producer reported them) on partition.
func (w *want) add(partition int, offsets []int64, ids ...string) {
	if len(offsets) != len(ids) {
		panic(fmt.Sprintf("%d offsets for %d ids", len(offsets), len(ids)))
	}
	for i, id := range ids {
		*w = append(*w, rec{Partition: partition, Offset: offsets[i], ID: id})
	}
}

func (w want) sorted() []rec {
	out := slices.Clone(w)
	slices.SortFunc(out, func(a, b rec) int {
		if a.Partition != b.Partition {
			return a.Partition - b.Partition
		}
		return int(a.Offset - b.Offset)
	})
	return out
}

// recsOf turns messages into recs, failing on a message without ID: a
// transaction marker has none.
func recsOf(t *testing.T, msgs []kafka.Message) []rec {
	t.Helper()
	out := make([]rec, 0, len(msgs))
	for _, m := range msgs {
		out = append(out, rec{Partition: m.Partition, Offset: m.Offset, ID: idOf(m)})
	}
	return out
}

func idOf(m kafka.Message) string {
	for _, h := range m.Headers {
		if h.Key == "message-id" {
			return string(h.Value)
		}
	}
	return fmt.Sprintf("<no id: key %x value %x>", m.Key, m.Value)
}

// sendAll queues records with ids on partition of pr's topic; key and value
// are derived from the id.
func sendAll(pr *txproducer.Producer, topic string, partition int, ids ...string) {
	for _, id := range ids {
		pr.Send(topic, partition, []byte("k-"+id), []byte("value of "+id), id)
	}
}

// produce writes ids to partition with kafka-go, outside any transaction,
// as one batch with compression c (0 for none), and returns their offsets.
func produce(t *testing.T, topic string, partition int, c kafka.Compression, ids ...string) []int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var res *kafka.ProduceResponse
	for {
		// Records made for each attempt: an attempt reads their keys and
		// values to the end.
		recs := make([]kafka.Record, len(ids))
		for i, id := range ids {
			recs[i] = kafka.Record{Key: kafka.NewBytes([]byte("k-" + id)), Value: kafka.NewBytes([]byte("value of " + id)),
				Headers: []kafka.Header{{Key: "message-id", Value: []byte(id)}}}
		}
		var err error
		res, err = testenv.Client(t).Produce(ctx, &kafka.ProduceRequest{Topic: topic, Partition: partition,
			RequiredAcks: kafka.RequireAll, Compression: c, Records: kafka.NewRecordReader(recs...)})
		if err == nil {
			err = res.Error
		}
		if err == nil {
			break
		}
		// A topic just created may refuse records for a moment (its leader
		// is not known everywhere yet): that is retriable.
		var kerr kafka.Error
		if !errors.As(err, &kerr) || !kerr.Temporary() || ctx.Err() != nil {
			t.Fatalf("produce to %s/%d: %v", topic, partition, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	out := make([]int64, len(ids))
	for i := range ids {
		out[i] = res.BaseOffset + int64(i)
	}
	return out
}

// ids returns prefix1..prefixN.
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i+1)
	}
	return out
}

// bounds are a partition's offsets as ListOffsets reports them.
type bounds struct{ start, hw, lso int64 }

func partitionBounds(t *testing.T, topic string, partition int) bounds {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b bounds
	for _, level := range []kafka.IsolationLevel{kafka.ReadUncommitted, kafka.ReadCommitted} {
		res, err := testenv.Client(t).ListOffsets(ctx, &kafka.ListOffsetsRequest{IsolationLevel: level,
			Topics: map[string][]kafka.OffsetRequest{topic: {kafka.FirstOffsetOf(partition), kafka.LastOffsetOf(partition)}}})
		if err != nil {
			t.Fatalf("list offsets: %v", err)
		}
		for _, po := range res.Topics[topic] {
			if po.Error != nil {
				t.Fatalf("list offsets: %v", po.Error)
			}
			b.start = po.FirstOffset
			if level == kafka.ReadCommitted {
				b.lso = po.LastOffset
			} else {
				b.hw = po.LastOffset
			}
		}
	}
	return b
}

// newReader returns a kread.Reader of topic/partition at offset.
func newReader(t *testing.T, topic string, partition int, offset int64, tune func(*kread.Config)) *kread.Reader {
	t.Helper()
	cfg := &kread.Config{Client: testenv.Client(t), Topic: topic, Partition: partition, MaxWait: 100 * time.Millisecond}
	if tune != nil {
		tune(cfg)
	}
	r, err := kread.New(cfg, offset)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// readTo fetches until the reader's offset reaches end and returns every
// record fetched and the last fetch. It fails when end is not reached
// within a minute.
func readTo(t *testing.T, r *kread.Reader, end int64) ([]kafka.Message, kread.Fetch) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []kafka.Message
	var last kread.Fetch
	for r.Offset() < end {
		before := r.Offset()
		f, err := r.Fetch(ctx)
		if err != nil {
			t.Fatalf("fetch at %d (want to reach %d): %v", before, end, err)
		}
		if f.Next < before {
			t.Fatalf("fetch at %d moved back to %d", before, f.Next)
		}
		if f.Next != r.Offset() {
			t.Fatalf("fetch returned Next %d, the reader is at %d", f.Next, r.Offset())
		}
		for _, m := range f.Records {
			if m.Offset < before || m.Offset >= f.Next {
				t.Fatalf("fetch at %d returned offset %d outside [%d, %d)", before, m.Offset, before, f.Next)
			}
		}
		out = append(out, f.Records...)
		last = f
	}
	return out, last
}

func equalRecs(t *testing.T, what string, got, want []rec) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s:\n got %v\nwant %v", what, got, want)
	}
}

// stableBounds waits until no transaction is open on the partition (its
// markers are written after the producer's commit or abort returned) and
// returns its bounds.
func stableBounds(t *testing.T, topic string, partition int) bounds {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		b := partitionBounds(t, topic, partition)
		if b.lso == b.hw {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("partition %d: last stable offset %d, high watermark %d after a minute: a transaction is open",
				partition, b.lso, b.hw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
