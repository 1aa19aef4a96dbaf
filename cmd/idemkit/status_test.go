package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// TestStatus seeds every kind of trouble status reports — lag, an old
// parked message, dead letters, an old outbox backlog, a stuck idempotency
// record, old processed records — and checks the JSON, the thresholds and
// the exit status; then a healthy picture exits 0.
func TestStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	topic := testenv.NewTopic(t, 2)
	suffix := "." + testenv.Name(t, "dead") // only this test's dead-letter topics
	dead := topic + suffix
	testenv.CreateTopic(t, dead, 1)
	for range 5 {
		testenv.Produce(t, topic, 0, kafka.Record{Value: kafka.NewBytes([]byte("m"))})
	}
	testenv.Produce(t, topic, 1, kafka.Record{Value: kafka.NewBytes([]byte("m"))})
	// Two dead letters nobody replayed, and a record that is none.
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing", Topic: dead})
	if err != nil {
		t.Fatal(err)
	}
	for _, offset := range []int64{3, 4} {
		m := &consumer.Message{ID: fmt.Sprint("m", offset), Message: kafka.Message{Topic: topic, Offset: offset, Value: []byte("m")}}
		if err := w.OnFailure(ctx, m, errors.New("bug")); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	testenv.Produce(t, dead, 0, kafka.Record{Value: kafka.NewBytes([]byte("not a dead letter"))})

	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// billing processed 2 of partition 0's 5 messages and partition 1's one.
	for _, c := range []dedup.Claim{
		{Consumer: "billing", MessageID: "m0", Topic: topic, Partition: 0, Offset: 0},
		{Consumer: "billing", MessageID: "m1", Topic: topic, Partition: 0, Offset: 1},
		{Consumer: "billing", MessageID: "n0", Topic: topic, Partition: 1, Offset: 0},
	} {
		if _, err := store.ClaimWithPositionTx(ctx, tx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := db.Pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`UPDATE ` + db.Table(migrate.ProcessedMessagesDefault) + ` SET processed_at = now() - interval '3 days' WHERE message_id = 'm0'`)
	exec(`INSERT INTO `+db.Table(migrate.ParkedMessagesDefault)+` (consumer, topic, kafka_partition, kafka_offset, message_key,
		message_id, parked_at) VALUES ('billing', $1, 0, 2, 'k', 'm2', now() - interval '2 hours')`, topic)
	now := time.Now()
	exec(`INSERT INTO `+db.Table(migrate.IdempotencyRecordsDefault)+` (account, operation, idempotency_key, fingerprint,
		state, token, locked_until, created_at, updated_at, expires_at)
		VALUES ('acct-1', 'POST /payments', 'k-1', '\x00', 'PROCESSING', 7, $1, $2, $2, $3)`,
		now.Add(-time.Minute), now.Add(-2*time.Minute), now.Add(time.Hour))
	ob, err := outbox.New(&outbox.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
		_, err := ob.EnqueueTx(ctx, tx, outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte("v")},
			outbox.Message{Topic: topic, Key: []byte("k"), Value: []byte("w")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond) // the outbox backlog has an age

	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t), "IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}
	args := []string{"status", "-json", "-schema", db.Schema, "-dlq-suffix", suffix,
		"-max-lag", "2", "-max-parked-age", "1h", "-max-outbox-age", "0s", "-max-stuck", "0", "-max-dlq", "1", "-retention", "24h"}
	out, errOut, code := cli(t, bin, env, args...)
	if code != exitThreshold {
		t.Fatalf("exit %d, want %d\n%s%s", code, exitThreshold, out, errOut)
	}
	var rep statusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("JSON: %v\n%s", err, out)
	}
	if len(rep.Consumers) != 1 {
		t.Fatalf("consumers %+v, want billing only", rep.Consumers)
	}
	c := rep.Consumers[0]
	if c.Consumer != "billing" || c.Topic != topic || len(c.Partitions) != 2 || c.Lag != 3 || c.Parked != 1 ||
		c.OldestParkedAgeSeconds == nil || *c.OldestParkedAgeSeconds < 7000 ||
		c.OldestRecordAgeSeconds == nil || *c.OldestRecordAgeSeconds < 3*86400-60 {
		t.Fatalf("billing: %s", mustJSON(c))
	}
	if p := c.Partitions[0]; p.Position != 2 || p.StableEnd == nil || *p.StableEnd != 5 || p.Lag == nil || *p.Lag != 3 {
		t.Fatalf("partition 0: %s", mustJSON(p))
	}
	if d := rep.DeadLetters; len(d) != 1 || d[0].Topic != dead || d[0].Messages != 3 || d[0].Unresolved != 2 ||
		d[0].Unreadable != 1 || !maps.Equal(d[0].States, map[dlq.State]int{dlq.StateUnresolved: 2}) {
		t.Fatalf("dead letters: %s", mustJSON(rep.DeadLetters))
	}
	if rep.Outbox == nil || rep.Outbox.Backlog != 2 || rep.Outbox.OldestAgeSeconds <= 0 || rep.Outbox.Dead != 0 || rep.Outbox.Held != 0 {
		t.Fatalf("outbox: %s", mustJSON(rep.Outbox))
	}
	if rep.Idempotency == nil || rep.Idempotency.Stuck != 1 {
		t.Fatalf("idempotency: %s", mustJSON(rep.Idempotency))
	}
	for _, want := range []string{"lag 3 > 2", "parked for 2h", "dead-letter topic " + dead + ": 2 unresolved origin messages > 1",
		"outbox idemkit_outbox: oldest unpublished message", "1 stuck in flight > 0", "purge behind"} {
		if !strings.Contains(strings.Join(rep.Crossed, "\n"), want) {
			t.Errorf("thresholds crossed %q: missing %q", rep.Crossed, want)
		}
	}
	if len(rep.Crossed) != 6 || !strings.Contains(errOut, "6 threshold(s) crossed") {
		t.Errorf("%d thresholds crossed, want 6; stderr %q", len(rep.Crossed), errOut)
	}

	// The same picture with thresholds it stays under: exit 0, and the
	// table form names everything.
	out, errOut, code = cli(t, bin, env, "status", "-schema", db.Schema, "-dlq-suffix", suffix,
		"-max-lag", "10", "-max-parked-age", "3h", "-max-outbox-age", "1h", "-max-stuck", "1", "-retention", "7d")
	if code != 2 || !strings.Contains(errOut, "-retention") {
		t.Fatalf("a bad duration: exit %d, want 2 naming the flag\n%s", code, errOut)
	}
	out, errOut, code = cli(t, bin, env, "status", "-schema", db.Schema, "-dlq-suffix", suffix,
		"-max-lag", "10", "-max-parked-age", "3h", "-max-outbox-age", "1h", "-max-stuck", "1", "-retention", "168h")
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"billing", topic, dead, "backlog 2", "dead 0 (0 of them held behind an earlier message of their key)", "1 stuck in flight"} {
		if !strings.Contains(out, want) {
			t.Errorf("table output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "THRESHOLD") {
		t.Errorf("a threshold reported as crossed:\n%s", out)
	}

	// A schema with none of the tables (a typo in -schema): a failure, so
	// that a probe does not pass on it.
	bare := testenv.NewDB(t)
	out, errOut, code = cli(t, bin, env, "status", "-json", "-schema", bare.Schema, "-dlq-suffix", suffix)
	if code != 1 || !strings.Contains(errOut, "has none of idemkit's tables") {
		t.Fatalf("unmigrated schema: exit %d, want 1\n%s%s", code, out, errOut)
	}
	// Some tables missing (only the consumer's migrated): notes, not errors.
	if _, err := bare.Pool.Exec(ctx, `DROP SCHEMA `+pgx.Identifier{bare.Schema}.Sanitize()+` CASCADE; CREATE SCHEMA `+
		pgx.Identifier{bare.Schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if err := testenv.Migrate(ctx, bare.Pool, bare.Schema); err != nil {
		t.Fatal(err)
	}
	if _, err := bare.Pool.Exec(ctx, `DROP TABLE `+bare.Table(migrate.OutboxDefault)+`, `+bare.Table(migrate.IdempotencyRecordsDefault)+
		`, `+bare.Table(migrate.DLQReplaysDefault)); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = cli(t, bin, env, "status", "-json", "-schema", bare.Schema, "-dlq-suffix", suffix)
	if code != 0 || !strings.Contains(out, "no outbox table") || !strings.Contains(out, "no idempotency records table") ||
		!strings.Contains(out, "no dead-letter replay records table") {
		t.Fatalf("partly migrated schema: exit %d\n%s%s", code, out, errOut)
	}
	// Without replay records no replay ran: every message is unresolved.
	rep = statusReport{}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.DeadLetters) != 1 || rep.DeadLetters[0].Unresolved != 2 {
		t.Fatalf("dead letters without replay records: %v\n%s", err, out)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestStatusHelp(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	for _, args := range [][]string{{"status", "-h"}, {"status", "--help"}} {
		out, errOut, code := cli(t, bin, nil, args...)
		if code != 0 || !strings.Contains(out, "usage: idemkit status") || !strings.Contains(out, "-max-lag") ||
			!strings.Contains(out, "3 a threshold was crossed") {
			t.Fatalf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
	}
}
