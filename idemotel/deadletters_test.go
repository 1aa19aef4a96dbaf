package idemotel_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/idemotel"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestDeadLetterStates: idemkit_dlq_messages counts the origin messages of
// a dead-letter topic per state: a message dead-lettered twice is one
// unresolved message, and once replayed it is no longer unresolved, though
// the topic keeps its records.
func TestDeadLetterStates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 1)
	dead := e.topic + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 1)
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, id := range []string{"a", "a", "b"} { // a twice: a crash before its position moved
		offset := []int64{0, 0, 1}[i]
		m := &consumer.Message{ID: id, Message: kafka.Message{Topic: e.topic, Offset: offset, Value: []byte("v")}}
		if err := w.OnFailure(ctx, m, &consumer.MessageError{Topic: e.topic, Offset: offset, ID: id, Attempts: 1,
			Class: retry.ClassPermanent, FirstFailure: now, LastFailure: now, Err: errors.New("bug")}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	g := e.runMonitor(idemotel.MonitorConfig{DeadLetterTopics: []string{dead}})
	want := func(unresolved, replayed float64) map[string]float64 {
		m := map[string]float64{}
		for _, s := range []string{"unresolved", "replayed", "applied", "exhausted", "superseded", "beyond-horizon"} {
			m[lbl("dlq_topic", dead, "state", s)] = 0
		}
		m[lbl("dlq_topic", dead, "state", "unresolved")] = unresolved
		m[lbl("dlq_topic", dead, "state", "replayed")] = replayed
		return m
	}
	e.eventually("idemkit.dlq.messages", fmt.Sprint(want(2, 0)), func(got map[string]float64) bool { return maps.Equal(got, want(2, 0)) })
	r, err := dlq.NewReprocessor(e.db.Pool, &dlq.ReprocessorConfig{Kafka: testenv.Kafka(t), Topic: dead,
		Mode: dlq.Republish, Tables: migrate.Tables{Schema: e.db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Run(ctx); err != nil {
		t.Fatal(err)
	}
	e.eventually("idemkit.dlq.messages", fmt.Sprint(want(0, 2)), func(got map[string]float64) bool { return maps.Equal(got, want(0, 2)) })
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if got := points(t, e.collect(), "idemkit.dlq.messages"); len(got) != 0 {
		t.Fatalf("after Close: %v, want no points", got)
	}
}

// TestDeadLetterWritesPerDestination: with a Writer's Routes, each write is
// counted under the dead-letter topic it went to, and every destination
// starts at zero.
func TestDeadLetterWritesPerDestination(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := newEnv(t, 1)
	dead, invalid := e.topic+dlq.TopicSuffixDefault, e.topic+".invalid"
	testenv.CreateTopic(t, dead, 1)
	testenv.CreateTopic(t, invalid, 1)
	errInvalid := errors.New("invalid")
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: e.group,
		Routes: []dlq.Route{dlq.RouteErrors(invalid, errInvalid)}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	c, err := e.tel.Consumer(e.config(nil))
	if err != nil {
		t.Fatal(err)
	}
	onFailure := c.DeadLetters(w)
	with := func(dlqTopic string) string { return lbl("consumer", e.group, "topic", e.topic, "dlq_topic", dlqTopic) }
	if got := points(t, e.collect(), "idemkit.dlq.writes"); !maps.Equal(got, map[string]float64{with(invalid): 0, with(dead): 0}) {
		t.Fatalf("before any write: %v", got)
	}
	now := time.Now()
	for i, cause := range []error{errInvalid, errors.New("bug"), errInvalid} {
		m := &consumer.Message{ID: fmt.Sprint("m", i), Message: kafka.Message{Topic: e.topic, Offset: int64(i), Value: []byte("v")}}
		if err := onFailure(ctx, m, &consumer.MessageError{Topic: e.topic, Offset: int64(i), ID: m.ID, Attempts: 1,
			Class: retry.ClassPermanent, FirstFailure: now, LastFailure: now, Err: cause}); err != nil {
			t.Fatal(err)
		}
	}
	if got := points(t, e.collect(), "idemkit.dlq.writes"); !maps.Equal(got, map[string]float64{with(invalid): 2, with(dead): 1}) {
		t.Fatalf("writes %v, want 2 to %s and 1 to %s", got, invalid, dead)
	}
}
