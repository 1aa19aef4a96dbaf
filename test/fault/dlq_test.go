package fault

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/faultproxy"
	"github.com/idemkit/idemkit/internal/outage"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestReplayThroughSilentPostgres: every PostgreSQL connection of a
// Republish replay goes silent (accepted, never answered) after its first
// dead letter. Its next read gives up after HandlerTimeout plus 10s, the
// reprocessor says it waits for the server, and once the path clears it
// republishes every dead letter once.
func TestReplayThroughSilentPostgres(t *testing.T) {
	t.Parallel()
	const n = 6
	ctx := context.Background()
	db := newDB(t)
	origin := testenv.NewTopic(t, 1)
	dead := origin + dlq.TopicSuffixDefault
	if err := kafkaconn.CreateTopic(ctx, kafkaconn.Config{Brokers: testenv.Brokers(t)}, dead, 1, 1); err != nil {
		t.Fatal(err)
	}
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	now := time.Now()
	for i := range n {
		id := fmt.Sprintf("d%d", i)
		m := &consumer.Message{ID: id, Message: kafka.Message{Topic: origin, Offset: int64(i), Value: []byte(id),
			Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}}
		if err := w.OnFailure(ctx, m, &consumer.MessageError{Topic: origin, Offset: int64(i), ID: id, Attempts: 1,
			Class: retry.ClassPermanent, FirstFailure: now, LastFailure: now, Err: errors.New("bug")}); err != nil {
			t.Fatal(err)
		}
	}

	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFaultProxy(t, u.Host)
	u.Host = proxy.Addr()
	pool := testenv.PartPool(t, ctx, u.String(), "dlq-silent", 4)
	waiting := make(chan struct{})
	_, log := testenv.NewLogs(t)
	log = slog.New(onMessage{Handler: log.Handler(), msg: outage.StartMsg, once: new(sync.Once), ch: waiting})
	var silenced sync.Once
	r, err := dlq.NewReprocessor(pool, &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: dead, Mode: dlq.Republish,
		Tables: migrate.Tables{Schema: db.Schema}, Logger: log, ReplayedBy: "test", HandlerTimeout: time.Second,
		Progress: func(dlq.Item) {
			silenced.Do(func() {
				proxy.Set(faultproxy.Blackhole)
				go func() {
					<-waiting
					proxy.Set(faultproxy.Pass)
				}()
			})
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	runCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	sum, err := r.Run(runCtx)
	if err != nil || sum.Records[dlq.Republished] != n {
		t.Fatalf("replay through a silent PostgreSQL: %v, %v", sum, err)
	}
	select {
	case <-waiting:
	default:
		t.Fatal("the replay did not say it waited for PostgreSQL")
	}
	ids := map[string]int{}
	for _, m := range testenv.ReadAll(t, testenv.Brokers(t), origin) {
		for _, h := range m.Headers {
			if h.Key == consumer.IDHeaderDefault {
				ids[string(h.Value)]++
			}
		}
	}
	if len(ids) != n {
		t.Fatalf("origin topic holds %d of the %d republished IDs: %v", len(ids), n, ids)
	}
	for id, c := range ids {
		if c != 1 {
			t.Fatalf("%s republished %d times", id, c)
		}
	}
}
