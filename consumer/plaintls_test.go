package consumer_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/kafkaconn"
)

// A consumer configured without TLS against a TLS listener has a setting to
// fix, not an outage to wait out: Run stops with kafkaconn.ErrTLS, as it does
// for a refused certificate (kafka-go's own error says "broker appears to be
// expecting TLS").
func TestPlaintextToTLSListenerIsNotAnOutage(t *testing.T) {
	t.Parallel()
	sasl := os.Getenv(testenv.EnvKafkaSASLBrokers)
	if sasl == "" {
		t.Fatalf("%s is not set: run scripts/dev start (it starts the SASL_SSL listener)", testenv.EnvKafkaSASLBrokers)
	}
	e := newEnv(t, 1)
	cfg := e.config(baseModes[0], nil)
	cfg.Kafka = kafkaconn.Config{Brokers: []string{sasl}}
	r, err := consumer.New(e.db.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	start := time.Now()
	err = r.Run(ctx)
	if ctx.Err() != nil {
		t.Fatalf("Run waited %v (until the test's deadline) and returned %v: a plaintext client on a TLS listener is waited out as an outage", time.Since(start).Round(time.Second), err)
	}
	if !errors.Is(err, kafkaconn.ErrTLS) {
		t.Fatalf("Run = %v, want kafkaconn.ErrTLS", err)
	}
}
