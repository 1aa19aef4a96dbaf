package kafkaconn

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"github.com/segmentio/kafka-go"
)

// ErrAuthentication matches an *Error of a broker that refused the SASL
// credentials or mechanism.
var ErrAuthentication = errors.New("authentication failed")

// ErrTLS matches an *Error of a TLS handshake that failed: a broker
// certificate the client does not trust or that names another host, a
// client certificate the broker refused, or a plaintext client on a TLS
// listener. (TLS spoken to a plaintext listener looks to the client like a
// connection the broker closed, EOF, which is waited out as an outage.)
var ErrTLS = errors.New("TLS handshake failed")

// Error is a connection that the brokers refused for its security
// settings. It names the brokers and the mechanism and user, never the
// password. Retrying does not help: the settings must change.
type Error struct {
	// Brokers are the bootstrap addresses of the Config.
	Brokers []string
	// Mechanism and Username are the SASL settings; empty without SASL.
	Mechanism Mechanism
	Username  string
	// Kind is ErrAuthentication or ErrTLS.
	Kind error
	// Err is kafka-go's or crypto/tls's error.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "kafka %s: %v", strings.Join(e.Brokers, ","), e.Kind)
	if e.Kind == ErrAuthentication && e.Mechanism != "" {
		fmt.Fprintf(&b, " (SASL %s as %q)", e.Mechanism, e.Username)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// Is matches Kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Wrap returns err as an *Error when it says the brokers refused c's
// security settings (see ErrAuthentication, ErrTLS); any other error, and
// nil, unchanged. An error that already is an *Error is not wrapped twice.
func (c *Config) Wrap(err error) error {
	if err == nil {
		return nil
	}
	var ke *Error
	if errors.As(err, &ke) {
		return err
	}
	kind := Classify(err)
	if kind == nil {
		return err
	}
	e := &Error{Brokers: c.Brokers, Kind: kind, Err: err}
	if c.SASL != nil {
		e.Mechanism, e.Username = Mechanism(strings.ToUpper(string(c.SASL.Mechanism))), c.SASL.Username
	}
	return e
}

// Classify returns ErrAuthentication or ErrTLS when err says a broker
// refused the connection's security settings, nil otherwise.
func Classify(err error) error {
	var (
		verify     *tls.CertificateVerificationError
		unknownCA  x509.UnknownAuthorityError
		hostname   x509.HostnameError
		invalid    x509.CertificateInvalidError
		header     tls.RecordHeaderError
		alert      tls.AlertError
		kafkaError kafka.Error
	)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrAuthentication):
		return ErrAuthentication
	case errors.Is(err, ErrTLS):
		return ErrTLS
	case errors.As(err, &kafkaError):
		switch kafkaError {
		case kafka.SASLAuthenticationFailed, kafka.UnsupportedSASLMechanism, kafka.IllegalSASLState:
			return ErrAuthentication
		}
		return nil
	case errors.As(err, &verify), errors.As(err, &unknownCA), errors.As(err, &hostname),
		errors.As(err, &invalid), errors.As(err, &header), errors.As(err, &alert):
		return ErrTLS
	case strings.Contains(err.Error(), "broker appears to be expecting TLS"):
		// kafka-go's word for a plaintext client on a TLS listener.
		return ErrTLS
	}
	return nil
}
