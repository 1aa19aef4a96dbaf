package dlq_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// createTopic creates topic with the given max.message.bytes (0: the
// broker's default) and deletes it at cleanup.
func createTopic(t *testing.T, topic string, maxMessageBytes int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := testenv.Client(t)
	tc := kafka.TopicConfig{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}
	if maxMessageBytes > 0 {
		tc.ConfigEntries = []kafka.ConfigEntry{{ConfigName: "max.message.bytes", ConfigValue: strconv.Itoa(maxMessageBytes)}}
	}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{tc}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	})
	if err := testenv.WaitTopic(ctx, client, topic, 1); err != nil {
		t.Fatal(err)
	}
}

// bigValue returns n reproducible pseudo-random bytes.
func bigValue(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// TestOversizeDeadLetterDoesNotStopTheConsumer: a message that fails for
// good and whose dead letter would not fit the dead-letter topic (Kafka's
// default limit) is dead-lettered all the same, its value kept in
// PostgreSQL, and the message behind it (same key) is applied; in both
// failure modes, for a value just under 1 MiB and for 5 MB (the origin
// topic's limit raised). A Redrive replay hands the handler the original
// bytes exactly; a Republish replay writes them back to the origin topic.
func TestOversizeDeadLetterDoesNotStopTheConsumer(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1_047_800, 5_000_000} {
		for _, mode := range []consumer.FailureMode{consumer.Blocking, consumer.NonBlocking} {
			t.Run(strconv.Itoa(size)+"/"+map[consumer.FailureMode]string{consumer.Blocking: "Blocking", consumer.NonBlocking: "NonBlocking"}[mode], func(t *testing.T) {
				t.Parallel()
				testOversize(t, size, mode)
			})
		}
	}
}

func testOversize(t *testing.T, size int, mode consumer.FailureMode) {
	e := newEnv(t, false)
	// The origin topic of the test, with room for the big message.
	e.topic = testenv.Name(t, "big")
	e.dlq = e.topic + dlq.TopicSuffixDefault
	originLimit := 0
	if size > 1<<20 {
		originLimit = 6 << 20
	}
	createTopic(t, e.topic, originLimit)
	createTopic(t, e.dlq, 0)
	value := bigValue(size)
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: e.topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, BatchBytes: 8 << 20}
	err := w.WriteMessages(context.Background(),
		kafka.Message{Key: []byte("k"), Value: value, Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte("big")}}},
		kafka.Message{Key: []byte("k"), Value: []byte("small"), Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte("next")}}})
	_ = w.Close()
	if err != nil {
		t.Fatal(err)
	}

	writer, err := dlq.NewWriter(oversizeWriterConfig(e))
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	var mu sync.Mutex
	outcomes := map[string]consumer.Outcome{}
	done := make(chan struct{})
	cfg := &consumer.Config{
		Kafka: testenv.Kafka(t), Topic: e.topic, GroupID: e.group, Store: e.store, Logger: e.logger,
		OnFailure: writer.OnFailure, FailureMode: mode, BatchSize: 1,
		Retry:       retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 1},
		ParkedRetry: retry.Policy{InitialInterval: 5 * time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2},
		ParkedPoll:  10 * time.Millisecond,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			if m.ID == "big" {
				if mode == consumer.Blocking {
					return retry.Permanent(errors.New("poison: cannot parse"))
				}
				return errors.New("poison: cannot parse") // transient: parked, then dead-lettered
			}
			return e.effect(ctx, tx, m)
		}),
		Observers: []consumer.Observer{&testobs.Hooks{OnOutcome: func(_ context.Context, m *consumer.Message, o consumer.Outcome) {
			mu.Lock()
			defer mu.Unlock()
			outcomes[m.ID] = o
			if outcomes["big"] == consumer.Failed && outcomes["next"] == consumer.Applied {
				select {
				case <-done:
				default:
					close(done)
				}
			}
		}}},
	}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	select {
	case <-done:
	case err := <-errc:
		cancel()
		t.Fatalf("Run stopped: %v", err)
	case <-time.After(45 * time.Second):
		cancel()
		<-errc
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the big message was not dead-lettered, or the next not applied: outcomes %v", outcomes)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}

	dls := e.deadLetters()
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	d := dls[0]
	if d.MessageID != "big" || d.StoredValue == nil || d.StoredValue.Size != size || len(d.Message.Value) != 0 {
		t.Fatalf("dead letter %q: stored %+v, value of %d bytes; want its %d bytes stored apart",
			d.MessageID, d.StoredValue, len(d.Message.Value), size)
	}
	if got := d.Last().Error; got != "poison: cannot parse" {
		t.Fatalf("last error %q", got)
	}
	if n := bytes.Count([]byte(header(d, dlq.HeaderHistory)), []byte("poison")); n != 0 {
		t.Fatalf("the history header repeats the error text (%d times)", n)
	}

	// Redrive: the handler gets the original bytes.
	var got []byte
	rp, err := dlq.NewReprocessor(e.db.Pool, &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: e.dlq,
		Mode: dlq.Redrive, Tables: migrate.Tables{Schema: e.db.Schema}, Logger: e.logger,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, m *consumer.Message) error {
			got = bytes.Clone(m.Value)
			return e.effect(ctx, tx, m)
		})})
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), time.Minute)
	defer rcancel()
	sum, err := rp.Run(rctx)
	if err != nil || sum.Records[dlq.Applied] != 1 {
		t.Fatalf("redrive: %v, %v", sum, err)
	}
	if !bytes.Equal(got, value) {
		t.Fatalf("redrive handed %d bytes, not the original %d", len(got), len(value))
	}
	if size < 1<<20 {
		return
	}
	// Republish (another round of the same letter, in a fresh record
	// table): the origin topic gets the original bytes back.
	if _, err := e.db.Pool.Exec(rctx, `DELETE FROM `+e.db.Table("idemkit_dlq_replays")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.db.Pool.Exec(rctx, `DELETE FROM `+e.db.Table("processed_messages")); err != nil {
		t.Fatal(err)
	}
	rp2, err := dlq.NewReprocessor(e.db.Pool, &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: e.dlq,
		Mode: dlq.Republish, Tables: migrate.Tables{Schema: e.db.Schema}, Logger: e.logger})
	if err != nil {
		t.Fatal(err)
	}
	defer rp2.Close()
	if sum, err := rp2.Run(rctx); err != nil || sum.Records[dlq.Republished] != 1 {
		t.Fatalf("republish: %v, %v", sum, err)
	}
	msgs := testenv.ReadAll(t, testenv.Brokers(t), e.topic)
	if last := msgs[len(msgs)-1]; !bytes.Equal(last.Value, value) {
		t.Fatalf("republished %d bytes, not the original %d", len(last.Value), len(value))
	}
}

// TestOversizeDeadLetterWithoutPoolWaits: without a Pool to keep its value,
// a dead letter too large for its topic is not a reason to stop the
// consumer: the writer tries it again, logging each attempt at ERROR, and
// once the topic's max.message.bytes is raised it is written whole and the
// next message flows.
func TestOversizeDeadLetterWithoutPoolWaits(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true)
	w := &kafka.Writer{Addr: kafka.TCP(testenv.Brokers(t)...), Topic: e.topic, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, BatchBytes: 8 << 20}
	value := bigValue(1_047_800)
	err := w.WriteMessages(context.Background(),
		kafka.Message{Key: []byte("k"), Value: value, Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte("big")}}},
		kafka.Message{Key: []byte("k"), Value: []byte("small"), Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte("next")}}})
	_ = w.Close()
	if err != nil {
		t.Fatal(err)
	}
	logs, logger := testenv.NewLogs(t)
	refused := make(chan struct{})
	var once sync.Once
	e.logger = logger
	e.consumeWith(2, func(m *consumer.Message, attempt int) error {
		if m.ID == "big" {
			return retry.Permanent(errors.New("poison"))
		}
		return nil
	}, func(cfg *consumer.Config) {
		writer, err := dlq.NewWriter(noPoolWriterConfig(e, func() { once.Do(func() { close(refused) }) }))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = writer.Close() })
		cfg.OnFailure = writer.OnFailure
		go func() {
			<-refused
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp, err := testenv.Client(t).AlterConfigs(ctx, &kafka.AlterConfigsRequest{Resources: []kafka.AlterConfigRequestResource{{
				ResourceType: kafka.ResourceTypeTopic, ResourceName: e.dlq,
				Configs: []kafka.AlterConfigRequestConfig{{Name: "max.message.bytes", Value: strconv.Itoa(2 << 20)}},
			}}})
			if err == nil {
				for _, err = range resp.Errors {
					if err != nil {
						break
					}
				}
			}
			if err != nil {
				t.Errorf("raise max.message.bytes: %v", err)
			}
		}()
	})
	dls := e.deadLetters()
	if len(dls) != 1 || !bytes.Equal(dls[0].Message.Value, value) {
		t.Fatalf("%d dead letters, want the big one whole", len(dls))
	}
	if n := logs.CountFunc("dead-letter write failed; the message waits and is tried again", func(rec map[string]any) bool {
		return rec["level"] == "ERROR" && rec["message_id"] == "big" && rec["topic"] == e.topic && rec["offset"] == 0.0 &&
			rec["dlq_topic"] == e.dlq
	}); n == 0 {
		t.Fatal("no ERROR log with the message's coordinates")
	}
	if runs := e.runs(); runs["next"] != 1 {
		t.Fatalf("effects %v, want next applied", runs)
	}
}
