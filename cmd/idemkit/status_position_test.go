package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestStatusPartitionWithoutPosition: billing consumes a 2-partition
// topic and is caught up on partition 0, but partition 1 has no position
// row (its first message is stuck in a handler retrying in place: the
// consumer writes a position only when a transaction commits). status
// lists only the partitions that have a row, so partition 1's 5 waiting
// messages count for nothing: lag 0, exit 0 — a probe reports healthy a
// partition that never moved. (With StartOffset FirstOffset, the default,
// everything from the log start is the partition's lag.)
func TestStatusPartitionWithoutPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	topic := testenv.NewTopic(t, 2)
	testenv.Produce(t, topic, 0, kafka.Record{Value: kafka.NewBytes([]byte("m"))})
	for range 5 {
		testenv.Produce(t, topic, 1, kafka.Record{Value: kafka.NewBytes([]byte("m"))})
	}
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.ClaimWithPositionTx(ctx, tx, dedup.Claim{Consumer: "billing", MessageID: "m0", Topic: topic, Partition: 0, Offset: 0}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t), "IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}
	out, errOut, code := cli(t, bin, env, "status", "-json", "-schema", db.Schema, "-dlq-suffix", "", "-max-lag", "2")
	var rep statusReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("JSON: %v\n%s%s", err, out, errOut)
	}
	if code != exitThreshold || len(rep.Consumers) != 1 || len(rep.Consumers[0].Partitions) != 2 || rep.Consumers[0].Lag != 5 {
		t.Fatalf("FAILS: exit %d (want %d), report %s: partition 1 (5 messages, no position) is missing and its lag uncounted",
			code, exitThreshold, mustJSON(rep.Consumers))
	}
}
