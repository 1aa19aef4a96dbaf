package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

// TestCLIReplayLetterWithoutID: a dead letter without message ID (written
// by the consumer for ErrMissingID) neither stops a dry run nor a replay:
// it is listed as such and republished, and the letters after it too.
func TestCLIReplayLetterWithoutID(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	origin := testenv.NewTopic(t, 1)
	dead := origin + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 1)
	env := []string{
		"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t),
		"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ","),
	}
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, id := range []string{"", "inv-9"} {
		m := &consumer.Message{ID: id, Message: kafka.Message{Topic: origin, Offset: int64(i), Key: []byte("k"), Value: []byte("v")}}
		cause := errors.New("tax service timeout")
		if id == "" {
			cause = consumer.ErrMissingID
		}
		merr := &consumer.MessageError{Topic: origin, Offset: int64(i), ID: id, Attempts: 1, Class: retry.ClassPermanent,
			FirstFailure: now, LastFailure: now, Err: cause}
		if err := w.OnFailure(context.Background(), m, merr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	schema := []string{"-schema", db.Schema}
	out, errOut, code := cli(t, bin, env, append([]string{"dlq", "replay", "-topic", dead, "-dry-run"}, schema...)...)
	if code != 0 || !strings.Contains(out, "dry run, nothing changed: 2 would-replay") || !strings.Contains(out, "0/0  (no id)") {
		t.Fatalf("dry run: code %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = cli(t, bin, env, append([]string{"dlq", "replay", "-topic", dead}, schema...)...)
	if code != 0 || !strings.Contains(out, "replayed: 1 republished, 1 republished-no-id") {
		t.Fatalf("replay: code %d\n%s%s", code, out, errOut)
	}
	if n := countMessages(t, origin); n != 2 {
		t.Fatalf("replay published %d messages to %s, want 2", n, origin)
	}
}

// TestCLIReplayCountsMessages: a message dead-lettered twice (a crash
// before the position moved) is two dead-letter records and one origin
// message; the dry run says what the run does, and both say it per record
// and per message, in text and -json.
func TestCLIReplayCountsMessages(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	origin := testenv.NewTopic(t, 1)
	dead := origin + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 1)
	env := []string{
		"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t),
		"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ","),
	}
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, id := range []string{"inv-1", "inv-1", "inv-2"} { // inv-1 twice at offset 0
		offset := []int64{0, 0, 1}[i]
		m := &consumer.Message{ID: id, Message: kafka.Message{Topic: origin, Offset: offset, Key: []byte("k"), Value: []byte("v")}}
		merr := &consumer.MessageError{Topic: origin, Offset: offset, ID: id, Attempts: 1, Class: retry.ClassPermanent,
			FirstFailure: now, LastFailure: now, Err: errors.New("tax service timeout")}
		if err := w.OnFailure(context.Background(), m, merr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	schema := []string{"-schema", db.Schema}
	out, errOut, code := cli(t, bin, env, append([]string{"dlq", "replay", "-topic", dead, "-dry-run", "-json"}, schema...)...)
	var got struct {
		DryRun      bool `json:"dry_run"`
		DeadLetters []struct {
			Action    string `json:"action"`
			MessageID string `json:"message_id"`
		} `json:"dead_letters"`
		Records  map[string]int `json:"records"`
		Messages map[string]int `json:"messages"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("dry run -json: code %d\n%s%s", code, out, errOut)
	}
	if !got.DryRun || len(got.DeadLetters) != 3 || got.DeadLetters[1].Action != "already-replayed" ||
		!maps.Equal(got.Records, map[string]int{"would-replay": 2, "already-replayed": 1}) ||
		!maps.Equal(got.Messages, map[string]int{"would-replay": 2}) {
		t.Fatalf("dry run -json:\n%s", out)
	}
	out, errOut, code = cli(t, bin, env, append([]string{"dlq", "replay", "-topic", dead}, schema...)...)
	if code != 0 || !strings.Contains(out, "replayed: 2 republished, 1 already-replayed\nper origin message (2): 2 republished\n") {
		t.Fatalf("replay: code %d\n%s%s", code, out, errOut)
	}
}

// TestCLIDeadLetterStates: `idemkit status -max-dlq` counts the origin
// messages no replay decided, not the records of the topic: once every
// dead letter was replayed it clears. `dlq list` shows each dead letter's
// state, grouped per origin message.
func TestCLIDeadLetterStates(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	origin := testenv.NewTopic(t, 1)
	suffix := "." + testenv.Name(t, "dead") // only this test's dead-letter topics
	dead := origin + suffix
	testenv.CreateTopic(t, dead, 1)
	env := []string{
		"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t),
		"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ","),
	}
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing", Topic: dead})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, id := range []string{"inv-1", "inv-2", "inv-1"} { // inv-1 twice: a crash before its position moved
		offset := []int64{0, 1, 0}[i]
		m := &consumer.Message{ID: id, Message: kafka.Message{Topic: origin, Offset: offset, Key: []byte("k"), Value: []byte("v")}}
		merr := &consumer.MessageError{Topic: origin, Offset: offset, ID: id, Attempts: 1, Class: retry.ClassPermanent,
			FirstFailure: now, LastFailure: now, Err: errors.New("tax service timeout")}
		if err := w.OnFailure(context.Background(), m, merr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	schema := []string{"-schema", db.Schema}
	status := append([]string{"status", "-dlq-suffix", suffix, "-max-lag", "-1", "-max-outbox-age", "-1s", "-max-dlq", "0"}, schema...)

	out, errOut, code := cli(t, bin, env, status...)
	if code != exitThreshold || !strings.Contains(out, "dead-letter topic "+dead+": 2 unresolved origin messages > 0") {
		t.Fatalf("status before the replay: exit %d, want %d\n%s%s", code, exitThreshold, out, errOut)
	}
	if out, errOut, code := cli(t, bin, env, append([]string{"dlq", "replay", "-topic", dead}, schema...)...); code != 0 {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = cli(t, bin, env, status...)
	if code != 0 || !strings.Contains(out, "2 replayed") {
		t.Fatalf("status after every dead letter was replayed: exit %d, want 0\n%s%s", code, out, errOut)
	}

	out, errOut, code = cli(t, bin, env, append([]string{"dlq", "list", "-topic", dead}, schema...)...)
	lines := strings.Split(out, "\n")
	if code != 0 || len(lines) < 4 || !strings.Contains(lines[0], "STATE") ||
		!strings.HasPrefix(lines[1], "0/0  replayed  inv-1") || !strings.HasPrefix(lines[2], "0/2  replayed  inv-1") ||
		!strings.HasPrefix(lines[3], "0/1  replayed  inv-2") ||
		!strings.Contains(out, "3 dead letter(s) of 2 origin message(s) shown of 3 record(s)") ||
		!strings.Contains(out, "origin messages: 2 replayed") {
		t.Fatalf("list: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = cli(t, bin, env, append([]string{"dlq", "list", "-topic", dead, "-json"}, schema...)...)
	var got struct {
		DeadLetters []struct {
			State  string `json:"state"`
			Replay *struct {
				Outcome string `json:"outcome"`
			} `json:"replay"`
		} `json:"dead_letters"`
		Messages []struct {
			MessageID   string   `json:"message_id"`
			State       string   `json:"state"`
			DeadLetters []string `json:"dead_letters"`
		} `json:"messages"`
		States map[string]int `json:"states"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got.DeadLetters) != 3 ||
		got.DeadLetters[0].State != "replayed" || got.DeadLetters[0].Replay == nil || got.DeadLetters[0].Replay.Outcome != "republished" ||
		len(got.Messages) != 2 || got.Messages[0].MessageID != "inv-1" || !slices.Equal(got.Messages[0].DeadLetters, []string{dead + "/0/0", dead + "/0/2"}) ||
		!maps.Equal(got.States, map[string]int{"replayed": 2}) {
		t.Fatalf("list -json: exit %d\n%s%s", code, out, errOut)
	}
	// A schema without replay records: the letters, their states unknown, and why.
	out, errOut, code = cli(t, bin, env, "dlq", "list", "-topic", dead, "-schema", "nowhere_at_all")
	if code != 0 || !strings.Contains(out, "0/0  ?") || !strings.Contains(out, "schema nowhere_at_all has no replay records table") {
		t.Fatalf("list with an unmigrated schema: exit %d\n%s%s", code, out, errOut)
	}
	// Without a database the states are unknown, and said so.
	out, errOut, code = cli(t, bin, []string{"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}, "dlq", "list", "-topic", dead)
	if code != 0 || !strings.Contains(out, "0/0  ?") || !strings.Contains(out, "states unknown") {
		t.Fatalf("list without a database: exit %d\n%s%s", code, out, errOut)
	}
}

// TestCLIRoutedDeadLetters: dead letters routed to several topics by error
// are listed together (-topic a,b) and counted per destination by status
// (-dlq-topics for the topics the suffix does not name).
func TestCLIRoutedDeadLetters(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	origin := testenv.NewTopic(t, 1)
	suffix := "." + testenv.Name(t, "dead")
	dead, invalid := origin+suffix, origin+".invalid"
	testenv.CreateTopic(t, dead, 1)
	testenv.CreateTopic(t, invalid, 1)
	env := []string{
		"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t),
		"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ","),
	}
	errInvalid := errors.New("invalid order")
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing", Topic: dead,
		Routes: []dlq.Route{dlq.RouteErrors(invalid, errInvalid)}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, cause := range []error{errInvalid, errors.New("tax service timeout")} {
		id := fmt.Sprint("inv-", i)
		m := &consumer.Message{ID: id, Message: kafka.Message{Topic: origin, Offset: int64(i), Key: []byte("k"), Value: []byte("v")}}
		merr := &consumer.MessageError{Topic: origin, Offset: int64(i), ID: id, Attempts: 1, Class: retry.ClassPermanent,
			FirstFailure: now, LastFailure: now, Err: cause}
		if err := w.OnFailure(context.Background(), m, merr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := cli(t, bin, env, "status", "-schema", db.Schema, "-dlq-suffix", suffix, "-dlq-topics", invalid,
		"-max-lag", "-1", "-max-outbox-age", "-1s", "-max-dlq", "0")
	if code != exitThreshold || !strings.Contains(out, "dead-letter topic "+dead+": 1 unresolved origin messages > 0") ||
		!strings.Contains(out, "dead-letter topic "+invalid+": 1 unresolved origin messages > 0") {
		t.Fatalf("status: exit %d, want %d\n%s%s", code, exitThreshold, out, errOut)
	}
	out, errOut, code = cli(t, bin, env, "dlq", "list", "-schema", db.Schema, "-topic", invalid+","+dead)
	fields := func(line string) string { return strings.Join(strings.Fields(line), " ") }
	lines := strings.Split(out, "\n")
	if code != 0 || len(lines) < 3 || !strings.HasPrefix(fields(lines[1]), invalid+"/0/0 unresolved inv-0") ||
		!strings.HasPrefix(fields(lines[2]), dead+"/0/0 unresolved inv-1") ||
		!strings.Contains(out, "2 dead letter(s) of 2 origin message(s) shown of 2 record(s)") {
		t.Fatalf("list of both: exit %d\n%s%s", code, out, errOut)
	}
}

// TestCLIReplayBeyondHorizon: with -retention, a dead letter whose message
// is older than the horizon and not in the dedup store is left alone as
// beyond-horizon; -apply-beyond-horizon replays it.
func TestCLIReplayBeyondHorizon(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	origin := testenv.NewTopic(t, 1)
	dead := origin + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 1)
	env := []string{
		"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t),
		"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ","),
	}
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	m := &consumer.Message{ID: "inv-1", Message: kafka.Message{Topic: origin, Key: []byte("k"), Value: []byte("v"), Time: old}}
	if err := w.OnFailure(context.Background(), m, errors.New("bug")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	replay := []string{"dlq", "replay", "-topic", dead, "-schema", db.Schema, "-retention", "1h"}
	out, errOut, code := cli(t, bin, env, replay...)
	if code != 0 || !strings.Contains(out, "replayed: 1 beyond-horizon\n") {
		t.Fatalf("replay -retention: exit %d\n%s%s", code, out, errOut)
	}
	if n := countMessages(t, origin); n != 0 {
		t.Fatalf("%d messages republished to %s, want none", n, origin)
	}
	out, errOut, code = cli(t, bin, env, append(replay, "-apply-beyond-horizon")...)
	if code != 0 || !strings.Contains(out, "replayed: 1 republished\n") {
		t.Fatalf("replay -apply-beyond-horizon: exit %d\n%s%s", code, out, errOut)
	}
}
