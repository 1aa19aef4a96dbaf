package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/retry"
)

// TestCLIInspectStoredValue: a dead letter whose value was too large for
// its topic (kept in PostgreSQL by the writer) shows its original value with
// -database, and its size without.
func TestCLIInspectStoredValue(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	origin := testenv.NewTopic(t, 1)
	dead := origin + dlq.TopicSuffixDefault
	testenv.CreateTopic(t, dead, 1)
	w, err := dlq.NewWriter(&dlq.WriterConfig{Kafka: testenv.Kafka(t), Group: "billing", Pool: db.Pool, Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	value := strings.Repeat("v", 1_047_800)
	m := &consumer.Message{ID: "inv-1", Message: kafka.Message{Topic: origin, Key: []byte("k"), Value: []byte(value)}}
	if err := w.OnFailure(context.Background(), m, retry.Permanent(errors.New("bad invoice"))); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	brokers := "IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")
	args := []string{"dlq", "inspect", "-topic", dead, "-at", "0/0", "-json", "-show-payload", "-schema", db.Schema}
	out, errOut, code := cli(t, bin, []string{brokers, "IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t)}, args...)
	var got []struct {
		Value       string `json:"value"`
		ValueStored int    `json:"value_stored"`
	}
	if err := json.Unmarshal([]byte(out), &got); code != 0 || err != nil || len(got) != 1 {
		t.Fatalf("inspect: code %d, %v\n%.500s%s", code, err, out, errOut)
	}
	if got[0].Value != value || got[0].ValueStored != len(value) {
		t.Fatalf("inspect shows %d bytes (stored %d), want the original %d", len(got[0].Value), got[0].ValueStored, len(value))
	}
	out, errOut, code = cli(t, bin, []string{brokers}, args[:len(args)-2]...)
	if code != 0 || !strings.Contains(out, "(1047800 bytes kept in PostgreSQL: give -database to show them)") {
		t.Fatalf("inspect without database: code %d\n%.500s%s", code, out, errOut)
	}
}
