package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
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
// overview: the time and the memory per page (-benchmem).
func BenchmarkDeadLetterPage(b *testing.B) {
	n := 2000
	if s := os.Getenv("IDEMKIT_BENCH_LETTERS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatal(err)
		}
	}
	db := testenv.NewDB(b, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		return testenv.Migrate(ctx, pool, schema)
	})
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
			b.ReportAllocs()
			for b.Loop() {
				r := httptest.NewRequest("GET", page, nil)
				r.Header.Set("Authorization", "Bearer "+testToken)
				rec := httptest.NewRecorder()
				c.ServeHTTP(rec, r)
				if rec.Code != http.StatusOK {
					b.Fatalf("%s: %d", page, rec.Code)
				}
			}
		})
	}
}
