package txn

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/kread"
	"github.com/idemkit/idemkit/retry"
	"github.com/idemkit/idemkit/test/internal/kafkaproc"
	"github.com/idemkit/idemkit/test/internal/txproducer"
)

// TestBrokerOutage: while its broker is down, a Fetch returns an error that
// retry.IsConnection recognises (callers wait it out) and the reader stays
// where it was; once the broker is back, reading continues at the same
// offset and returns each committed record once.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	broker := kafkaproc.Start(t)
	transport := &kafka.Transport{DialTimeout: time.Second, MetadataTTL: time.Second}
	t.Cleanup(transport.CloseIdleConnections)
	client := &kafka.Client{Addr: kafka.TCP(broker.Addr), Timeout: 10 * time.Second, Transport: transport}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	topic := "outage"
	res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}})
	if err == nil {
		err = res.Errors[topic]
	}
	if err != nil {
		t.Fatal(err)
	}

	jp := txproducer.Start(t, broker.Addr)
	pr := jp.Producer("", txproducer.None)
	var w want
	pr.Begin()
	sendAll(pr, topic, 0, "c1", "c2")
	w.add(0, pr.Commit(), "c1", "c2")
	pr.Begin()
	sendAll(pr, topic, 0, "a1")
	pr.Abort()
	pr.Begin()
	sendAll(pr, topic, 0, "c3", "c4")
	w.add(0, pr.Commit(), "c3", "c4")
	pr.Close()

	// Read one batch (c1, c2) per fetch.
	r, err := kread.New(&kread.Config{Client: client, Topic: topic, MaxBytes: 1, MaxWait: 100 * time.Millisecond}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []kafka.Message
	fetch := func() (kread.Fetch, error) {
		f, err := r.Fetch(ctx)
		got = append(got, f.Records...)
		return f, err
	}
	// Until the broker answers (a new topic's leader may refuse at first).
	for {
		_, err := fetch()
		if err == nil {
			break
		}
		if !retry.IsConnection(err) || ctx.Err() != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(got) != 2 {
		t.Fatalf("first fetch: %v, want c1 and c2", recsOf(t, got))
	}
	at := r.Offset()

	if err := broker.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		_, err := fetch()
		if err == nil || !retry.IsConnection(err) {
			t.Fatalf("fetch with the broker down: %v; want a connection error", err)
		}
		if r.Offset() != at {
			t.Fatalf("the reader moved from %d to %d on an error", at, r.Offset())
		}
	}
	if err := broker.Start(ctx); err != nil {
		t.Fatal(err)
	}
	var last kread.Fetch
	for last.Next < 8 {
		f, err := fetch()
		if err != nil {
			if !retry.IsConnection(err) || ctx.Err() != nil {
				t.Fatalf("fetch after the broker restarted: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
			continue
		}
		last = f
	}
	equalRecs(t, "across the outage", recsOf(t, got), w.sorted())
	if last.Next != last.HighWatermark || last.Next != 8 {
		t.Fatalf("last fetch %+v: want Next at the log end 8", last)
	}
}
