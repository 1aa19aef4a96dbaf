package kafkaconn_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/idemkit/idemkit/kafkaconn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestValidate(t *testing.T) {
	t.Parallel()
	b := []string{"127.0.0.1:9094"}
	for name, c := range map[string]kafkaconn.Config{
		"no brokers":        {},
		"empty broker":      {Brokers: []string{" "}},
		"negative timeout":  {Brokers: b, DialTimeout: -1},
		"unknown mechanism": {Brokers: b, SASL: &kafkaconn.SASL{Mechanism: "GSSAPI", Username: "u", Password: "p"}},
		"no username":       {Brokers: b, SASL: &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA512, Password: "p"}},
		"no password":       {Brokers: b, SASL: &kafkaconn.SASL{Mechanism: kafkaconn.Plain, Username: "u"}},
	} {
		if err := c.Validate(); !errors.Is(err, kafkaconn.ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v", name, err)
		}
		if _, err := c.Dialer(); !errors.Is(err, kafkaconn.ErrInvalidConfig) {
			t.Errorf("%s: Dialer = %v", name, err)
		}
		if _, err := c.Transport(); !errors.Is(err, kafkaconn.ErrInvalidConfig) {
			t.Errorf("%s: Transport = %v", name, err)
		}
	}
	for _, m := range []string{"plain", "scram-sha-256", "SCRAM-SHA-512"} {
		c := kafkaconn.Config{Brokers: b, SASL: &kafkaconn.SASL{Mechanism: kafkaconn.Mechanism(m), Username: "u", Password: "p"}}
		d, err := c.Dialer()
		if err != nil || d.SASLMechanism == nil || !strings.EqualFold(d.SASLMechanism.Name(), m) {
			t.Errorf("%s: Dialer = %+v, %v", m, d, err)
		}
		tr, err := c.Transport()
		if err != nil || tr.SASL == nil || tr.DialTimeout != kafkaconn.DialTimeoutDefault {
			t.Errorf("%s: Transport = %+v, %v", m, tr, err)
		}
	}
}

func TestNoPasswordInTexts(t *testing.T) {
	t.Parallel()
	c := kafkaconn.Config{Brokers: []string{"k:9094"}, SASL: &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA512, Username: "alice", Password: "s3cret"}}
	err := c.Wrap(fmt.Errorf("metadata: %w", kafka.SASLAuthenticationFailed))
	var kerr *kafkaconn.Error
	if !errors.Is(err, kafkaconn.ErrAuthentication) || !errors.As(err, &kerr) || !errors.Is(err, kafka.SASLAuthenticationFailed) {
		t.Fatalf("Wrap = %v", err)
	}
	for _, s := range []string{err.Error(), c.String(), fmt.Sprintf("%+v", kerr)} {
		if strings.Contains(s, "s3cret") || !strings.Contains(s, "k:9094") {
			t.Errorf("%q: carries the password or lacks the broker", s)
		}
	}
	if other := errors.New("x"); c.Wrap(other) != other || c.Wrap(nil) != nil {
		t.Error("Wrap changed an unrelated error")
	}
}

func TestLoadTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.pem")
	if err := os.WriteFile(empty, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]kafkaconn.TLSFiles{
		"missing CA":   {CA: filepath.Join(dir, "nope.pem")},
		"empty CA":     {CA: empty},
		"cert alone":   {Cert: empty},
		"bad key pair": {Cert: empty, Key: empty},
	} {
		if _, err := kafkaconn.LoadTLS(f); !errors.Is(err, kafkaconn.ErrInvalidConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if c, err := kafkaconn.LoadTLS(kafkaconn.TLSFiles{}); err != nil || c.RootCAs != nil {
		t.Errorf("system roots: %+v, %v", c, err)
	}
}

// TestCreateTopicRefusesBadInput: a name, partitions and replicas are
// checked before anything connects.
func TestCreateTopicRefusesBadInput(t *testing.T) {
	c := kafkaconn.Config{Brokers: []string{"127.0.0.1:1"}}
	for _, tt := range []struct {
		topic                string
		partitions, replicas int
	}{{"", 1, 1}, {"t", 0, 1}, {"t", 1, 0}, {"t", -3, 1}, {"t", 1, -2}} {
		err := kafkaconn.CreateTopic(context.Background(), c, tt.topic, tt.partitions, tt.replicas)
		if !errors.Is(err, kafkaconn.ErrInvalidConfig) {
			t.Errorf("CreateTopic(%q, %d, %d) = %v, want ErrInvalidConfig", tt.topic, tt.partitions, tt.replicas, err)
		}
	}
	if err := kafkaconn.CreateTopic(context.Background(), kafkaconn.Config{}, "t", 1, 1); !errors.Is(err, kafkaconn.ErrInvalidConfig) {
		t.Errorf("CreateTopic without brokers = %v, want ErrInvalidConfig", err)
	}
}
