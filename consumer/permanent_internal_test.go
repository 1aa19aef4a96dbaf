package consumer

import (
	"crypto/x509"
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/kafkaconn"
)

// The errors kafkaconn says "retrying does not help" for must stop the
// group loop too, not spin in it (kafka-go's ConsumerGroup hands dial
// errors of the coordinator to Next): refused TLS or credentials end the
// group loop instead of being retried for ever, and a coordinator can
// present another certificate than the bootstrap broker.
func TestPermanentGroupErrorCoversKafkaconn(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("dial: %w", x509.UnknownAuthorityError{}),
		fmt.Errorf("dial: %w", x509.HostnameError{Certificate: &x509.Certificate{}, Host: "kafka-1"}),
		kafka.UnsupportedSASLMechanism,
		kafka.IllegalSASLState,
	} {
		if kafkaconn.Classify(err) == nil {
			t.Fatalf("Classify(%v) = nil", err)
		}
		if !permanentGroupError(err) {
			t.Errorf("permanentGroupError(%v) = false; kafkaconn.Classify = %v: the group loop retries it for ever", err, kafkaconn.Classify(err))
		}
	}
}
