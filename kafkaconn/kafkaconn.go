package kafkaconn

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/idemkit/idemkit"
)

// DialTimeoutDefault is how long opening one connection to a broker (TCP,
// TLS handshake and SASL exchange) may take by default.
const DialTimeoutDefault = 10 * time.Second

// Mechanism is a SASL mechanism, named as Kafka names it.
type Mechanism string

// The SASL mechanisms idemkit speaks (kafka-go's sasl/plain and sasl/scram).
const (
	Plain       Mechanism = "PLAIN"
	ScramSHA256 Mechanism = "SCRAM-SHA-256"
	ScramSHA512 Mechanism = "SCRAM-SHA-512"
)

// ParseMechanism reads a mechanism name case-insensitively ("plain",
// "scram-sha-512"). An unknown name is an error wrapping ErrInvalidConfig.
func ParseMechanism(s string) (Mechanism, error) {
	m := Mechanism(strings.ToUpper(strings.TrimSpace(s)))
	switch m {
	case Plain, ScramSHA256, ScramSHA512:
		return m, nil
	}
	return "", fmt.Errorf("%w: unknown SASL mechanism %q (want plain, scram-sha-256 or scram-sha-512)", ErrInvalidConfig, s)
}

// SASL says how the client authenticates.
type SASL struct {
	// Mechanism is Plain, ScramSHA256 or ScramSHA512. Required.
	Mechanism Mechanism
	// Username and Password are the credentials. Both required. Password
	// never appears in errors, logs or String.
	Username string
	Password string
}

// Config is how to reach a Kafka cluster. Brokers is required; the zero
// value of every other field means plaintext without authentication.
type Config struct {
	// Brokers are the bootstrap addresses, host:port.
	Brokers []string
	// TLS, when not nil, encrypts every connection with it (see LoadTLS).
	// Defaults to nil: plaintext.
	TLS *tls.Config
	// SASL, when not nil, authenticates every connection. Over a plaintext
	// connection PLAIN sends the password in clear: use TLS with it.
	// Defaults to nil: no authentication.
	SASL *SASL
	// ClientID is the client.id brokers see (in their logs, quotas and
	// ACL decisions). Defaults to kafka-go's ("" means "kafka-go" for
	// transports and the dialer).
	ClientID string
	// DialTimeout bounds opening one connection, handshakes included.
	// Defaults to 10s.
	DialTimeout time.Duration
	// Dial, when set, opens the TCP connection to a broker (at the address
	// the cluster advertises): for a tunnel, a SOCKS proxy or a test's
	// fault proxy. TLS and SASL run over the connection it returns.
	// Defaults to a net.Dialer with TCP keepalives (first probe after 15s
	// of silence, then every 5s, the connection dropped after 3 unanswered:
	// a broker gone silent is noticed within 30s even between requests).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
}

// The TCP keepalives of the default dialer.
const (
	keepaliveIdle     = 15 * time.Second
	keepaliveInterval = 5 * time.Second
	keepaliveCount    = 3
)

// dial returns Dial, or the default dialer.
func (c *Config) dial() func(ctx context.Context, network, address string) (net.Conn, error) {
	if c.Dial != nil {
		return c.Dial
	}
	d := &net.Dialer{Timeout: cmp.Or(c.DialTimeout, DialTimeoutDefault), KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: keepaliveIdle, Interval: keepaliveInterval, Count: keepaliveCount}}
	return d.DialContext
}

// ErrInvalidConfig is wrapped by every error of Validate.
var ErrInvalidConfig = fmt.Errorf("kafkaconn: %w", idemkit.ErrInvalidConfig)

// Validate checks c without connecting.
func (c *Config) Validate() error {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if c == nil {
		return invalid("nil config")
	}
	if len(c.Brokers) == 0 {
		return invalid("Brokers is empty")
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			return invalid("Brokers holds an empty address")
		}
	}
	if c.DialTimeout < 0 {
		return invalid("DialTimeout must not be negative")
	}
	if s := c.SASL; s != nil {
		if _, err := ParseMechanism(string(s.Mechanism)); err != nil {
			return err
		}
		if s.Username == "" {
			return invalid("SASL %s needs a Username", s.Mechanism)
		}
		if s.Password == "" {
			return invalid("SASL %s needs a Password", s.Mechanism)
		}
		if _, err := s.scram(); err != nil {
			return err
		}
	}
	return nil
}

// scram returns the SCRAM mechanism of s, nil for other mechanisms. The
// error of a username or password that SASLprep refuses never quotes them
// (xdg-go/scram's does, password included).
func (s *SASL) scram() (sasl.Mechanism, error) {
	m, _ := ParseMechanism(string(s.Mechanism))
	algo := scram.SHA512
	switch m {
	case ScramSHA256:
		algo = scram.SHA256
	case ScramSHA512:
	default:
		return nil, nil
	}
	mech, err := scram.Mechanism(algo, s.Username, s.Password)
	if err != nil {
		return nil, fmt.Errorf("%w: SASL %s: the username or the password holds a character SASLprep (RFC 4013) "+
			"forbids, such as a control character", ErrInvalidConfig, m)
	}
	return mech, nil
}

// String describes c without its password: "SASL_SSL 127.0.0.1:9094
// (SCRAM-SHA-512 as alice)".
func (c *Config) String() string {
	proto := "PLAINTEXT"
	switch {
	case c.TLS != nil && c.SASL != nil:
		proto = "SASL_SSL"
	case c.TLS != nil:
		proto = "SSL"
	case c.SASL != nil:
		proto = "SASL_PLAINTEXT"
	}
	s := proto + " " + strings.Join(c.Brokers, ",")
	if c.SASL != nil {
		s += fmt.Sprintf(" (%s as %s)", strings.ToUpper(string(c.SASL.Mechanism)), c.SASL.Username)
	}
	return s
}

// Addr is the bootstrap address of a kafka.Writer or kafka.Client.
func (c *Config) Addr() net.Addr { return kafka.TCP(c.Brokers...) }

func (c *Config) mechanism() (sasl.Mechanism, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	s := c.SASL
	if s == nil {
		return nil, nil
	}
	m, _ := ParseMechanism(string(s.Mechanism))
	switch m {
	case Plain:
		return plain.Mechanism{Username: s.Username, Password: s.Password}, nil
	case ScramSHA256, ScramSHA512:
		return s.scram()
	}
	return nil, fmt.Errorf("%w: unknown SASL mechanism %q", ErrInvalidConfig, s.Mechanism)
}

// Dialer returns a kafka.Dialer for consumer groups, readers and
// kafka.Conn, or the error of Validate.
func (c *Config) Dialer() (*kafka.Dialer, error) {
	mech, err := c.mechanism()
	if err != nil {
		return nil, err
	}
	return &kafka.Dialer{ClientID: c.ClientID, Timeout: cmp.Or(c.DialTimeout, DialTimeoutDefault), DualStack: true,
		TLS: c.TLS, SASLMechanism: mech, DialFunc: c.dial()}, nil
}

// Transport returns a new kafka.Transport for writers and clients, or the
// error of Validate. The caller owns it: CloseIdleConnections ends its
// connections (and their goroutines) when it is no longer used.
func (c *Config) Transport() (*kafka.Transport, error) {
	mech, err := c.mechanism()
	if err != nil {
		return nil, err
	}
	return &kafka.Transport{ClientID: c.ClientID, DialTimeout: cmp.Or(c.DialTimeout, DialTimeoutDefault),
		TLS: c.TLS, SASL: mech, Dial: c.dial()}, nil
}

// TLSFiles names PEM files for LoadTLS.
type TLSFiles struct {
	// CA is the certificates to trust, PEM. Empty: the system's roots.
	CA string
	// Cert and Key are a client certificate and its key, PEM, for brokers
	// that authenticate clients by certificate (mutual TLS). Both or none.
	Cert, Key string
	// ServerName overrides the name checked in the broker's certificate.
	// Empty: the host of the address dialed.
	ServerName string
}

// LoadTLS reads f into a tls.Config (TLS 1.2 at least). An unreadable file,
// a CA file without a certificate or a certificate without its key is an
// error wrapping ErrInvalidConfig that names the file.
func LoadTLS(f TLSFiles) (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("%w: CA file: %w", ErrInvalidConfig, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: CA file %s holds no PEM certificate", ErrInvalidConfig, f.CA)
		}
		conf.RootCAs = pool
	}
	if (f.Cert == "") != (f.Key == "") {
		return nil, fmt.Errorf("%w: a client certificate needs both a certificate and a key file", ErrInvalidConfig)
	}
	if f.Cert != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("%w: client certificate %s / key %s: %w", ErrInvalidConfig, f.Cert, f.Key, err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}
