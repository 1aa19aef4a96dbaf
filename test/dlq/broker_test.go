package dlq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/kafkaproc"
)

// logBuffer collects log lines from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func createTopic(t *testing.T, client *kafka.Client, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err == nil {
		err = testenv.WaitTopic(ctx, client, topic, partitions)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// outage kills the broker and starts it again after d, in the background;
// wait waits for the restart. It may run on any goroutine.
func outage(t *testing.T, broker *kafkaproc.Broker, d time.Duration) (wait func()) {
	if err := broker.Stop(syscall.SIGKILL); err != nil {
		t.Error(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(d)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := broker.Start(ctx); err != nil {
			t.Error(err)
		}
	}()
	return func() { <-done }
}

// TestBrokerKilledMidReplay: the reprocessor's broker is killed twice in the
// middle of a Republish replay (once before a republish, once before the
// next partition of the dead-letter topic is read) and started again a few
// seconds later. The reprocessor waits each outage out, logs it, and
// republishes every dead letter. Then the broker is killed while a Writer
// dead-letters a message: OnFailure waits and succeeds once it is back.
func TestBrokerKilledMidReplay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	broker := kafkaproc.Start(t)
	brokers := []string{broker.Addr}
	client := &kafka.Client{Addr: kafka.TCP(broker.Addr), Timeout: 10 * time.Second}
	origin := testenv.Name(t, "idemkit")
	dead := origin + dlq.TopicSuffixDefault
	createTopic(t, client, origin, 1)
	createTopic(t, client, dead, 2)
	db := testenv.NewDB(t, testenv.Migrate)

	var logs logBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: kafkaconn.Config{Brokers: brokers}, Group: "g", Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const n = 8
	now := time.Now()
	fail := func(i int) error {
		id := fmt.Sprintf("b%d", i)
		m := &consumer.Message{ID: id, Message: kafka.Message{Topic: origin, Offset: int64(i), Key: []byte("key-" + id),
			Value: []byte("v-" + id), Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}}
		return w.OnFailure(ctx, m, &consumer.MessageError{Topic: origin, Offset: int64(i), ID: id, Attempts: 1,
			Class: retry.ClassPermanent, FirstFailure: now, LastFailure: now, Err: errors.New("bug")})
	}
	for i := range n {
		if err := fail(i); err != nil {
			t.Fatal(err)
		}
	}
	perPartition := map[int]int{}
	for _, m := range testenv.ReadAll(t, brokers, dead) {
		perPartition[m.Partition]++
	}
	if perPartition[0] < 2 || perPartition[1] < 1 {
		t.Fatalf("dead letters per partition %v: the test needs two in partition 0 and one in 1", perPartition)
	}

	var waits []func()
	seen0 := 0
	r, err := dlq.NewReprocessor(db.Pool, &dlq.ReprocessorConfig{Kafka: kafkaconn.Config{Brokers: brokers}, Topic: dead, Mode: dlq.Republish,
		Tables: migrate.Tables{Schema: db.Schema}, Logger: logger, ReplayedBy: "test",
		Progress: func(it dlq.Item) {
			if it.Raw.Partition != 0 {
				return
			}
			seen0++
			// Before the next republish, and before partition 1 is read.
			if seen0 == 1 || seen0 == perPartition[0] {
				if len(waits) > 0 {
					waits[len(waits)-1]() // the broker is up (a write went through); let its start finish
				}
				waits = append(waits, outage(t, broker, 3*time.Second))
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	runCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	sum, err := r.Run(runCtx)
	for _, wait := range waits {
		wait()
	}
	if err != nil || sum.Records[dlq.Republished] != n || len(waits) != 2 {
		t.Fatalf("replay through two broker outages: %v, %v (%d outages)\n%s", sum, err, len(waits), logs.String())
	}
	ids := map[string]bool{}
	for _, m := range testenv.ReadAll(t, brokers, origin) {
		for _, h := range m.Headers {
			if h.Key == consumer.IDHeaderDefault {
				ids[string(h.Value)] = true
			}
		}
	}
	if len(ids) != n {
		t.Fatalf("origin topic holds %d of the %d republished IDs: %v", len(ids), n, ids)
	}
	starts, ends := logs.count("server unreachable; waiting it out"), logs.count("server reachable again")
	if starts < 2 || starts != ends {
		t.Fatalf("logged %d outage starts and %d ends; want each outage's start and end once:\n%s", starts, ends, logs.String())
	}

	// The writer: the broker goes away while a message is dead-lettered.
	wait := outage(t, broker, 3*time.Second)
	if err := fail(n); err != nil {
		t.Fatalf("OnFailure through a broker outage: %v", err)
	}
	wait()
	if got := len(testenv.ReadAll(t, brokers, dead)); got != n+1 {
		t.Fatalf("%d dead letters, want %d", got, n+1)
	}
	if s, e := logs.count("server unreachable; waiting it out"), logs.count("server reachable again"); s != starts+1 || e != ends+1 {
		t.Fatalf("the writer's outage logged %d starts and %d ends, want one of each:\n%s", s-starts, e-ends, logs.String())
	}
}
