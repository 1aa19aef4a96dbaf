package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/internal/testobs"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// The tests of this file talk to the dev broker's SASL_SSL listener only
// (scripts/dev start: TLS with its CA, SCRAM-SHA-512 as alice): topics,
// produce, consume, dead letters, replay and the CLI all go through one
// kafkaconn.Config. Without the listener's variables they fail with the fix.

// saslTopics creates an origin topic and its dead-letter topic through kc
// (kafkaconn.CreateTopic) and deletes them at cleanup, through kc too.
func saslTopics(t *testing.T, kc kafkaconn.Config) (origin, dead string) {
	t.Helper()
	origin = testenv.Name(t, "idemkit_sasl")
	dead = origin + dlq.TopicSuffixDefault
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, topic := range []string{origin, dead} {
		if err := kafkaconn.CreateTopic(ctx, kc, topic, 1, 1); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		tr, err := kc.Transport()
		if err != nil {
			t.Error(err)
			return
		}
		defer tr.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		client := &kafka.Client{Addr: kc.Addr(), Transport: tr, Timeout: 30 * time.Second}
		_, _ = client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{origin, dead}})
	})
	return origin, dead
}

// saslProduce writes messages to topic through kc, acknowledged by all.
func saslProduce(t *testing.T, kc kafkaconn.Config, topic string, msgs ...kafka.Message) {
	t.Helper()
	tr, err := kc.Transport()
	if err != nil {
		t.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kc.Addr(), Topic: topic, Transport: tr, RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond, AllowAutoTopicCreation: false}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The topic's leader may take a moment after CreateTopic.
	for deadline := time.Now().Add(30 * time.Second); ; {
		err = w.WriteMessages(ctx, msgs...)
		if err == nil || time.Now().After(deadline) || !errors.Is(err, kafka.UnknownTopicOrPartition) && !errors.Is(err, kafka.LeaderNotAvailable) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatalf("produce to %s: %v", topic, err)
	}
}

// saslCLIEnv is the environment of a CLI run against kc's listener: TLS
// with the dev CA, SCRAM-SHA-512, the password from $IDEMKIT_KAFKA_PASSWORD.
func saslCLIEnv(t *testing.T, kc kafkaconn.Config, password string) []string {
	return []string{
		"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t),
		"IDEMKIT_KAFKA_BROKERS=" + strings.Join(kc.Brokers, ","),
		"IDEMKIT_KAFKA_CA=" + os.Getenv(testenv.EnvKafkaCA),
		"IDEMKIT_KAFKA_SASL=scram-sha-512",
		"IDEMKIT_KAFKA_USER=" + kc.SASL.Username,
		"IDEMKIT_KAFKA_PASSWORD=" + password,
	}
}

// runSASLConsumer runs a consumer on origin through kc until want outcomes were
// seen or the time is up, and returns Run's error and the outcomes by
// message ID.
func runSASLConsumer(t *testing.T, pool *pgxpool.Pool, cfg consumer.Config, want int) (map[string]consumer.Outcome, error) {
	t.Helper()
	var (
		mu   sync.Mutex
		seen = map[string]consumer.Outcome{}
		done = make(chan struct{})
	)
	testobs.Of(&cfg).OnOutcome = func(_ context.Context, msg *consumer.Message, o consumer.Outcome) {
		mu.Lock()
		defer mu.Unlock()
		seen[msg.ID] = o
		if len(seen) == want {
			close(done)
		}
	}
	r, err := consumer.New(pool, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	select {
	case <-done:
		cancel()
		err = <-runErr
	case err = <-runErr:
	case <-ctx.Done():
		err = <-runErr
		t.Fatalf("consumer saw %d of %d outcomes within 90s (Run: %v)", len(seen), want, err)
	}
	mu.Lock()
	defer mu.Unlock()
	out := make(map[string]consumer.Outcome, len(seen))
	for k, v := range seen {
		out[k] = v
	}
	return out, err
}

// TestSASLConsumeDeadLetterReplayList: over TLS + SCRAM-SHA-512 only, a
// consumer applies one message and dead-letters another (dlq.Writer), the
// CLI lists the dead letter, replays it to the origin topic (the password
// from a file this time), the consumer, its dependency healed, applies it,
// and the CLI lists the letter as replayed. No output carries the password.
func TestSASLConsumeDeadLetterReplayList(t *testing.T) {
	t.Parallel()
	kc := testenv.SASL(t)
	password := kc.SASL.Password
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	origin, dead := saslTopics(t, kc)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	group := testenv.Name(t, "g")
	saslProduce(t, kc, origin,
		kafka.Message{Key: []byte("acct-1"), Value: []byte(`{"amount":10}`), Headers: []kafka.Header{{Key: "message-id", Value: []byte("pay-ok")}}},
		kafka.Message{Key: []byte("acct-2"), Value: []byte(`{"amount":20}`), Headers: []kafka.Header{{Key: "message-id", Value: []byte("pay-bad")}}})

	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: kc, Group: group})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var healed bool
	var applied []string
	cfg := consumer.Config{Kafka: kc, Topic: origin, GroupID: group, Store: store,
		Retry: retry.Policy{MaxAttempts: 1}, OnFailure: w.OnFailure,
		Handler: consumer.HandlerFunc(func(ctx context.Context, tx pgx.Tx, msg *consumer.Message) error {
			if msg.ID == "pay-bad" && !healed {
				return retry.Permanent(errors.New("ledger rejected the account"))
			}
			applied = append(applied, msg.ID)
			return nil
		})}
	seen, err := runSASLConsumer(t, db.Pool, cfg, 2)
	if err != nil {
		t.Fatalf("consumer over SASL_SSL: %v", err)
	}
	if seen["pay-ok"] != consumer.Applied || seen["pay-bad"] != consumer.Failed {
		t.Fatalf("outcomes %v, want pay-ok applied, pay-bad failed", seen)
	}

	env := saslCLIEnv(t, kc, password)
	out, errOut, code := cli(t, bin, env, "dlq", "list", "-topic", dead, "-schema", db.Schema)
	if code != 0 || !strings.Contains(out, "pay-bad") || !strings.Contains(out, "ledger rejected the account") {
		t.Fatalf("dlq list over SASL_SSL: code %d\n%s%s", code, out, errOut)
	}

	pwFile := filepath.Join(t.TempDir(), "kafka-password")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	replayEnv := append(saslCLIEnv(t, kc, ""), "IDEMKIT_KAFKA_PASSWORD=") // the file only
	out2, errOut2, code := cli(t, bin, replayEnv, "dlq", "replay", "-topic", dead, "-schema", db.Schema,
		"-kafka-password-file", pwFile)
	if code != 0 || !strings.Contains(out2, "replayed: 1 republished") {
		t.Fatalf("dlq replay over SASL_SSL: code %d\n%s%s", code, out2, errOut2)
	}

	healed = true
	applied = nil
	seen, err = runSASLConsumer(t, db.Pool, cfg, 1)
	if err != nil {
		t.Fatalf("consumer over SASL_SSL after the replay: %v", err)
	}
	if seen["pay-bad"] != consumer.Applied || len(applied) != 1 || applied[0] != "pay-bad" {
		t.Fatalf("after the replay: outcomes %v, handler ran for %v; want pay-bad applied once", seen, applied)
	}

	out3, errOut3, code := cli(t, bin, env, "dlq", "list", "-topic", dead, "-json", "-schema", db.Schema)
	if code != 0 || !strings.Contains(out3, `"pay-bad"`) {
		t.Fatalf("dlq list -json after the replay: code %d\n%s%s", code, out3, errOut3)
	}
	for _, o := range []string{out, errOut, out2, errOut2, out3, errOut3} {
		if strings.Contains(o, password) {
			t.Fatalf("the CLI printed the SASL password:\n%s", o)
		}
	}
}

// TestSASLWrongPassword: a wrong password is one clear error everywhere —
// it names the broker and says authentication failed, matches
// kafkaconn.ErrAuthentication, is not waited out as an outage — and
// nothing is lost: the consumer keeps its position and a dead-letter write
// is refused, not dropped; the CLI exits 1 with one line without the
// password. With the right password the message is then applied.
func TestSASLWrongPassword(t *testing.T) {
	t.Parallel()
	good := testenv.SASL(t)
	bad := good
	bad.SASL = &kafkaconn.SASL{Mechanism: good.SASL.Mechanism, Username: good.SASL.Username, Password: "not-" + good.SASL.Password}
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	origin, dead := saslTopics(t, good)
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	saslProduce(t, good, origin, kafka.Message{Key: []byte("k"), Value: []byte("v"),
		Headers: []kafka.Header{{Key: "message-id", Value: []byte("pay-1")}}})
	broker := good.Brokers[0]
	checkErr := func(what string, err error) {
		t.Helper()
		var kerr *kafkaconn.Error
		switch {
		case err == nil:
			t.Fatalf("%s with a wrong password: no error", what)
		case !errors.Is(err, kafkaconn.ErrAuthentication) || !errors.As(err, &kerr):
			t.Fatalf("%s with a wrong password: %v; want a *kafkaconn.Error matching ErrAuthentication", what, err)
		case !strings.Contains(err.Error(), broker) || !strings.Contains(err.Error(), "authentication failed"):
			t.Fatalf("%s: %q does not name the broker %s and say authentication failed", what, err, broker)
		case strings.Contains(err.Error(), bad.SASL.Password):
			t.Fatalf("%s: the error carries the password: %v", what, err)
		}
	}

	// The consumer stops at once with the error; it does not wait it out.
	handler := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	start := time.Now()
	_, err = runSASLConsumer(t, db.Pool, consumer.Config{Kafka: bad, Topic: origin, GroupID: testenv.Name(t, "g"),
		Store: store, Handler: handler}, 1)
	checkErr("consumer.Run", err)
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("consumer.Run took %v to give up on a wrong password", d)
	}

	// A dead-letter write is refused, not dropped or retried for ever.
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: bad, Group: "g"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	msg := &consumer.Message{ID: "pay-1", Message: kafka.Message{Topic: origin, Key: []byte("k"), Value: []byte("v")}}
	checkErr("dlq.Writer.OnFailure", w.OnFailure(ctx, msg, errors.New("boom")))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	checkErr("dlq.Scan", dlq.Scan(ctx, bad, dead, func(kafka.Message) error { return nil }))

	// The CLI: exit 1, one line naming the broker, no password.
	for _, args := range [][]string{{"dlq", "list", "-topic", dead, "-schema", db.Schema}, {"dlq", "replay", "-topic", dead, "-schema", db.Schema}} {
		out, errOut, code := cli(t, bin, saslCLIEnv(t, bad, bad.SASL.Password), args...)
		line := strings.TrimRight(errOut, "\n")
		if code != 1 || strings.Contains(line, "\n") || !strings.Contains(line, broker) ||
			!strings.Contains(line, "authentication failed") || strings.Contains(out+errOut, bad.SASL.Password) {
			t.Fatalf("idemkit %s with a wrong password: code %d, want 1 and one line naming %s and the failed authentication, without the password\nstdout: %s\nstderr: %s",
				strings.Join(args, " "), code, broker, out, errOut)
		}
	}

	// Nothing was lost: with the right password the message is applied.
	seen, err := runSASLConsumer(t, db.Pool, consumer.Config{Kafka: good, Topic: origin, GroupID: testenv.Name(t, "g"),
		Store: store, Handler: handler}, 1)
	if err != nil || seen["pay-1"] != consumer.Applied {
		t.Fatalf("with the right password: outcomes %v, Run: %v; want pay-1 applied", seen, err)
	}
}

// TestSASLSettingsRefused: bad settings are errors before anything
// connects: an unknown mechanism, SASL without credentials, an unreadable
// CA file; in the CLI too (usage errors exit 2, an unreadable file 1).
func TestSASLSettingsRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.NewDB(t).Pool
	h := consumer.HandlerFunc(func(context.Context, pgx.Tx, *consumer.Message) error { return nil })
	for name, kc := range map[string]kafkaconn.Config{
		"no brokers":        {},
		"unknown mechanism": {Brokers: []string{"127.0.0.1:1"}, SASL: &kafkaconn.SASL{Mechanism: "GSSAPI", Username: "u", Password: "p"}},
		"no username":       {Brokers: []string{"127.0.0.1:1"}, SASL: &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA256, Password: "p"}},
		"no password":       {Brokers: []string{"127.0.0.1:1"}, SASL: &kafkaconn.SASL{Mechanism: kafkaconn.Plain, Username: "u"}},
	} {
		if _, err := consumer.New(pool, &consumer.Config{Kafka: kc, Topic: "t", GroupID: "g", Handler: h}); !errors.Is(err, kafkaconn.ErrInvalidConfig) || !errors.Is(err, consumer.ErrInvalidConfig) {
			t.Errorf("consumer.New, %s: %v", name, err)
		}
		if _, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: kc, Group: "g"}); !errors.Is(err, kafkaconn.ErrInvalidConfig) {
			t.Errorf("dlq.NewWriter, %s: %v", name, err)
		}
		if err := dlq.Scan(context.Background(), kc, "t", nil); !errors.Is(err, kafkaconn.ErrInvalidConfig) {
			t.Errorf("dlq.Scan, %s: %v", name, err)
		}
	}
	if _, err := kafkaconn.LoadTLS(kafkaconn.TLSFiles{CA: "/nonexistent/ca.pem"}); !errors.Is(err, kafkaconn.ErrInvalidConfig) ||
		!strings.Contains(err.Error(), "/nonexistent/ca.pem") {
		t.Errorf("LoadTLS of a missing CA file: %v", err)
	}

	bin := binary(t)
	env := []string{"IDEMKIT_KAFKA_BROKERS=127.0.0.1:1", "IDEMKIT_KAFKA_PASSWORD=secret-pw"}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"-kafka-sasl", "gssapi", "-kafka-user", "u"}, 2, "-kafka-sasl"},
		{[]string{"-kafka-sasl", "scram-sha-512"}, 2, "-kafka-user"},
		{[]string{"-kafka-user", "u"}, 2, "-kafka-sasl"},
		{[]string{"-kafka-ca", "/nonexistent/ca.pem"}, 1, "/nonexistent/ca.pem"},
		{[]string{"-kafka-cert", "/nonexistent/c.pem"}, 2, "-kafka-key"},
	} {
		out, errOut, code := cli(t, bin, env, append([]string{"dlq", "list", "-topic", "t.dlq"}, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.says) || strings.Contains(out+errOut, "secret-pw") {
			t.Errorf("idemkit dlq list %v: code %d (want %d), stderr %q (want it to name %s)", c.args, code, c.code, errOut, c.says)
		}
	}
	out, errOut, code := cli(t, bin, append(env, "IDEMKIT_KAFKA_TLS=maybe"), "dlq", "list", "-topic", "t.dlq")
	if code != 2 || !strings.Contains(errOut, "IDEMKIT_KAFKA_TLS") {
		t.Errorf("IDEMKIT_KAFKA_TLS=maybe: code %d\n%s%s", code, out, errOut)
	}
}
