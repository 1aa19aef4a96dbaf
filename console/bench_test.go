package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// BenchmarkDeadLetterPage renders one page of 50 of a dead-letter topic
// holding IDEMKIT_BENCH_LETTERS letters (2000 by default), and the
// overview of it and of IDEMKIT_BENCH_CONSUMERS consumers (50 by default)
// with a position on each of the 12 partitions of a topic: the time, the
// memory allocated (-benchmem) and the peak of the heap in use per page
// (peak-heap-MiB).
func BenchmarkDeadLetterPage(b *testing.B) {
	env := func(name string, def int) int {
		s := os.Getenv(name)
		if s == "" {
			return def
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		return n
	}
	n, consumers := env("IDEMKIT_BENCH_LETTERS", 2000), env("IDEMKIT_BENCH_CONSUMERS", 50)
	db := testenv.NewDB(b, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		return testenv.Migrate(ctx, pool, schema)
	})
	// The consumers: each with a position on every partition of one topic
	// of 12, as runners write them.
	source := testenv.NewTopic(b, 12)
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO `+db.Table(migrate.ConsumerPositionsDefault)+
		` (consumer, topic, kafka_partition, next_offset) SELECT 'bench-' || c, $1, p, 0
		FROM generate_series(1, $2::int) c, generate_series(0, 11) p`, source, consumers); err != nil {
		b.Fatal(err)
	}
	topic := testenv.NewTopic(b, 1)
	dead := topic + dlq.TopicSuffixDefault
	testenv.CreateTopic(b, dead, 1)
	// The letters, written as the dlq.Writer writes them, in batches.
	now := time.Now().UTC()
	history := fmt.Sprintf(`[{"round":0,"error":"no order","class":"permanent","attempts":1,"first_failure":%q,"last_failure":%q}]`,
		now.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(b)...), Topic: dead, RequiredAcks: kafka.RequireAll, BatchSize: 500,
		BatchTimeout: time.Millisecond}
	var batch []kafka.Message
	for i := range n {
		batch = append(batch, kafka.Message{Key: []byte("k"), Value: []byte(`{"amount":100,"note":"a payment of some size"}`),
			Headers: []kafka.Header{{Key: dlq.HeaderOriginTopic, Value: []byte(topic)}, {Key: dlq.HeaderOriginPartition, Value: []byte("0")},
				{Key: dlq.HeaderOriginOffset, Value: []byte(strconv.Itoa(i))}, {Key: dlq.HeaderMessageID, Value: fmt.Appendf(nil, "pay-%d", i)},
				{Key: dlq.HeaderConsumer, Value: []byte("bench")}, {Key: dlq.HeaderGroup, Value: []byte("bench")},
				{Key: dlq.HeaderHistory, Value: []byte(history)}}})
		if len(batch) == 500 || i == n-1 {
			if err := w.WriteMessages(context.Background(), batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	_ = w.Close()
	c, err := New(db.Pool, &Config{Kafka: testenv.Kafka(b), Tables: migrate.Tables{Schema: db.Schema}, DLQSuffix: dead,
		Authorize: TokenAuth(testToken, testName)})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	for _, page := range []string{"/dlq/" + url.PathEscape(dead) + "?page=3", "/"} {
		b.Run(page, func(b *testing.B) {
			serve := func() {
				r := httptest.NewRequest("GET", page, nil)
				r.Header.Set("Authorization", "Bearer "+testToken)
				rec := httptest.NewRecorder()
				c.ServeHTTP(rec, r)
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d", page, rec.Code)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				serve()
			}
			// Out of the timed loop: the heap's peak while one page is
			// served, collected often so that the peak is what is held.
			defer debug.SetGCPercent(debug.SetGCPercent(10))
			b.ReportMetric(float64(peakHeap(serve))/(1<<20), "peak-heap-MiB")
		})
	}
}
