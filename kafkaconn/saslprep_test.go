package kafkaconn_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idemkit/kafkaconn"
)

// A SCRAM password that SASLprep refuses (here: a tab, an ASCII control
// character) must not appear in the error of Transport or Dialer.
// A SCRAM password SASLprep refuses (here a tab) is refused by Validate,
// with an error that does not quote it, nor do Transport's and Dialer's
// (xdg-go/scram's own error quotes the password).
func TestSASLprepErrorKeepsThePasswordOut(t *testing.T) {
	const secret = "s3cr3t-Hunter2\tx"
	for _, m := range []kafkaconn.Mechanism{kafkaconn.ScramSHA256, kafkaconn.ScramSHA512} {
		c := kafkaconn.Config{Brokers: []string{"127.0.0.1:1"},
			SASL: &kafkaconn.SASL{Mechanism: m, Username: "alice", Password: secret}}
		if err := c.Validate(); err == nil || strings.Contains(err.Error(), "s3cr3t-Hunter2") {
			t.Errorf("%s: Validate = %v, want an error without the password", m, err)
		}
		if _, err := c.Transport(); err != nil && strings.Contains(err.Error(), "s3cr3t-Hunter2") {
			t.Errorf("%s: Transport error leaks the password: %v", m, err)
		}
		if _, err := c.Dialer(); err != nil && strings.Contains(err.Error(), "s3cr3t-Hunter2") {
			t.Errorf("%s: Dialer error leaks the password: %v", m, err)
		}
	}
}
