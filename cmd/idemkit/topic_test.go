package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/testenv"
)

// TestTopicCreate: idemkit topic create makes the topics with the
// partitions asked, leaves an existing one as it is, and refuses bad
// usage with exit 2.
func TestTopicCreate(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	env := []string{"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}
	a, b := testenv.Name(t, "orders"), testenv.Name(t, "orders_dlq")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = testenv.Client(t).DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{a, b}})
	})
	out, errOut, code := cli(t, bin, env, "topic", "create", "-partitions", "3", a, b)
	if code != 0 || !strings.Contains(out, "topic "+a+": ready") || !strings.Contains(out, "topic "+b+": ready") {
		t.Fatalf("topic create: exit %d\n%s%s", code, out, errOut)
	}
	partitions := func(topic string) int {
		// A client of its own: a shared one answers from its cached
		// metadata, which may predate the topic.
		tr := &kafka.Transport{}
		defer tr.CloseIdleConnections()
		client := &kafka.Client{Addr: kafka.TCP(testenv.Brokers(t)...), Transport: tr}
		md, err := client.Metadata(context.Background(), &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil || len(md.Topics) != 1 || md.Topics[0].Error != nil {
			t.Fatalf("metadata of %s: %+v, %v", topic, md, err)
		}
		return len(md.Topics[0].Partitions)
	}
	if n := partitions(a); n != 3 {
		t.Fatalf("%s has %d partitions, want 3", a, n)
	}
	// Again, with other settings: the topic exists, nothing changes.
	if out, errOut, code := cli(t, bin, env, "topic", "create", "-partitions", "5", a); code != 0 {
		t.Fatalf("topic create of an existing topic: exit %d\n%s%s", code, out, errOut)
	}
	if n := partitions(a); n != 3 {
		t.Fatalf("%s has %d partitions after a second create, want 3", a, n)
	}
	for _, args := range [][]string{{"topic", "create"}, {"topic", "create", "-partitions", "0", a}, {"topic", "create", "-replicas", "0", a}} {
		if _, errOut, code := cli(t, bin, env, args...); code != 2 || errOut == "" {
			t.Errorf("%v: exit %d, %q; want 2 with a message", args, code, errOut)
		}
	}
}
