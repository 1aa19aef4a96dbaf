package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/retry"
)

func TestMain(m *testing.M) { testenv.Main(m, nil) }

// binary builds the command once per test run.
func binary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "idemkit")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// cli runs the command as a user would and returns its output and exit code.
func cli(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func TestCLIAsANewUserWould(t *testing.T) {
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

	// Two dead letters, as a consumer would have written them.
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, id := range []string{"inv-1", "inv-2"} {
		m := &consumer.Message{ID: id, Message: kafka.Message{Topic: origin, Partition: 0, Offset: int64(10 + i),
			Key: []byte("acct-7"), Value: []byte(`{"invoice":"` + id + `"}`),
			Headers: []kafka.Header{{Key: consumer.IDHeaderDefault, Value: []byte(id)}}}}
		merr := &consumer.MessageError{Topic: origin, Offset: int64(10 + i), ID: id, Attempts: 5, Class: retry.ClassTransient,
			FirstFailure: now, LastFailure: now, Err: errors.New("tax service timeout for " + id)}
		if err := w.OnFailure(context.Background(), m, merr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	out, errOut, code := cli(t, bin, env, "dlq", "list", "-topic", dead, "-schema", db.Schema)
	if code != 0 || !strings.Contains(out, "inv-1") || !strings.Contains(out, "inv-2") ||
		!strings.Contains(out, "tax service timeout") || !strings.Contains(out, "2 dead letter(s) of 2 origin message(s) shown of 2 record(s)") {
		t.Fatalf("list: code %d\n%s%s", code, out, errOut)
	}
	out, _, code = cli(t, bin, env, "dlq", "list", "-topic", dead, "-message-id", "inv-2", "-schema", db.Schema)
	if code != 0 || strings.Contains(out, "inv-1") || !strings.Contains(out, "1 dead letter(s) of 1 origin message(s) shown of 2 record(s)") {
		t.Fatalf("list filtered: code %d\n%s", code, out)
	}
	out, _, code = cli(t, bin, env, "dlq", "inspect", "-topic", dead, "-id", "inv-1")
	if code != 0 || !strings.Contains(out, "origin      "+origin+" partition 0 offset 10") ||
		!strings.Contains(out, "consumer    billing") || !strings.Contains(out, "transient, 5 attempt(s)") {
		t.Fatalf("inspect: code %d\n%s", code, out)
	}

	schema := []string{"-schema", db.Schema}
	out, _, code = cli(t, bin, env, append([]string{"dlq", "replay", "-topic", dead, "-dry-run"}, schema...)...)
	if code != 0 || !strings.Contains(out, "dry run, nothing changed: 2 would-replay") || !strings.Contains(out, "would-replay      0/0  inv-1") {
		t.Fatalf("dry run: code %d\n%s", code, out)
	}
	if n := countMessages(t, origin); n != 0 {
		t.Fatalf("dry run published %d messages", n)
	}

	out, _, code = cli(t, bin, env, append([]string{"dlq", "replay", "-topic", dead}, schema...)...)
	if code != 0 || !strings.Contains(out, "replayed: 2 republished") {
		t.Fatalf("replay: code %d\n%s", code, out)
	}
	if n := countMessages(t, origin); n != 2 {
		t.Fatalf("replay published %d messages to %s, want 2", n, origin)
	}
	out, _, code = cli(t, bin, env, append([]string{"dlq", "replay", "-topic", dead}, schema...)...)
	if code != 0 || !strings.Contains(out, "2 already-replayed") || countMessages(t, origin) != 2 {
		t.Fatalf("second replay: code %d\n%s", code, out)
	}

	// Errors: usage errors exit 2 with the usage; unreachable servers exit 1 with one line.
	for _, args := range [][]string{
		{},
		{"dlq", "list"},
		{"dlq", "frobnicate", "-topic", dead},
		{"dlq", "list", "-topic", dead, "-since", "yesterday"},
		{"dlq", "inspect", "-topic", dead},
		{"migrate", "down"},
	} {
		_, errOut, code := cli(t, bin, env, args...)
		if code != 2 || !strings.Contains(errOut, "usage:") {
			t.Errorf("%v: exit %d, want 2 with usage; stderr %q", args, code, errOut)
		}
	}
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"dlq", "list", "-topic", dead, "-brokers", "127.0.0.1:1"}, nil, "does not answer"},
		{[]string{"dlq", "list", "-topic", "no-such-topic.dlq"}, nil, "does not exist"},
		{[]string{"migrate", "status"}, []string{"IDEMKIT_DATABASE_URL=postgres://nobody@127.0.0.1:1/x?connect_timeout=2"}, "PostgreSQL"},
	} {
		_, errOut, code := cli(t, bin, append(append([]string{}, env...), tc.env...), tc.args...)
		if code != 1 || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit 1 and one line with %q", tc.args, code, errOut, tc.want)
		}
	}

	out, _, code = cli(t, bin, env, append([]string{"migrate", "status"}, schema...)...)
	if code != 0 || !strings.Contains(out, "schema "+db.Schema+": applied") {
		t.Fatalf("migrate status: code %d\n%s", code, out)
	}
}

func countMessages(t *testing.T, topic string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := testenv.Client(t).ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{
		topic: {kafka.FirstOffsetOf(0), kafka.LastOffsetOf(0)}}})
	if err != nil {
		t.Fatal(err)
	}
	po := resp.Topics[topic][0]
	return po.LastOffset - po.FirstOffset
}
