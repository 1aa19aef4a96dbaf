// Command idemkit-console runs idemkit's web console (package console) on
// its own, against a database and a Kafka cluster:
//
//	idemkit-console [-listen 127.0.0.1:8089] [-read-only] -database URL [-schema S] -brokers B [kafka flags]
//
// It listens on 127.0.0.1 unless -listen says otherwise, and admits the
// requests that carry its token: $IDEMKIT_CONSOLE_TOKEN, or one it generates
// and prints once at start. The connection flags are those of the idemkit
// command: -database and -brokers default to $IDEMKIT_DATABASE_URL and
// $IDEMKIT_KAFKA_BROKERS; -kafka-tls, -kafka-ca, -kafka-cert, -kafka-key,
// -kafka-server-name, -kafka-sasl, -kafka-user, -kafka-password-file and
// -kafka-client-id default to their $IDEMKIT_KAFKA_* variables; the SASL
// password comes from $IDEMKIT_KAFKA_PASSWORD or -kafka-password-file,
// never from a flag. It stops cleanly on SIGINT or SIGTERM.
package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/console"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, nil)
	stop()
	var usage *usageError
	switch {
	case errors.Is(err, flag.ErrHelp):
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "idemkit-console:", err)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "idemkit-console:", err)
		os.Exit(1)
	}
}

type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// flags are the command's flags.
type flags struct {
	listen, database, schema, brokers string
	readOnly, secureCookie            bool
	dlqSuffix, dlqTopics              string
	tls                               bool
	ca, cert, key, serverName         string
	sasl, user, passwordFile          string
	clientID                          string
}

// envDefaults are the environment variables of the flags that have one:
// those of the idemkit command.
var envDefaults = map[string]string{
	"database":            "IDEMKIT_DATABASE_URL",
	"brokers":             "IDEMKIT_KAFKA_BROKERS",
	"kafka-tls":           "IDEMKIT_KAFKA_TLS",
	"kafka-ca":            "IDEMKIT_KAFKA_CA",
	"kafka-cert":          "IDEMKIT_KAFKA_CERT",
	"kafka-key":           "IDEMKIT_KAFKA_KEY",
	"kafka-server-name":   "IDEMKIT_KAFKA_SERVER_NAME",
	"kafka-sasl":          "IDEMKIT_KAFKA_SASL",
	"kafka-user":          "IDEMKIT_KAFKA_USER",
	"kafka-password-file": "IDEMKIT_KAFKA_PASSWORD_FILE",
	"kafka-client-id":     "IDEMKIT_KAFKA_CLIENT_ID",
}

func (f *flags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.listen, "listen", "127.0.0.1:8089", "address to listen on (loopback unless told otherwise)")
	fs.BoolVar(&f.readOnly, "read-only", false, "hide every action: the console only shows")
	fs.BoolVar(&f.secureCookie, "secure-cookie", false, "mark the sign-in cookie Secure: set it when a proxy serves the console over https")
	fs.StringVar(&f.database, "database", "", "PostgreSQL URL (default $IDEMKIT_DATABASE_URL)")
	fs.StringVar(&f.schema, "schema", "public", "schema of idemkit's tables")
	fs.StringVar(&f.dlqSuffix, "dlq-suffix", ".dlq", "dead-letter topics are the topics whose name ends with this")
	fs.StringVar(&f.dlqTopics, "dlq-topics", "", "more dead-letter topics, comma-separated (the destinations of dlq.WriterConfig.Routes)")
	fs.StringVar(&f.brokers, "brokers", "", "Kafka bootstrap addresses, comma-separated (default $IDEMKIT_KAFKA_BROKERS)")
	fs.BoolVar(&f.tls, "kafka-tls", false, "speak TLS to the brokers, trusting the system's CAs or -kafka-ca (default $IDEMKIT_KAFKA_TLS)")
	fs.StringVar(&f.ca, "kafka-ca", "", "PEM `file` of the CAs to trust; implies -kafka-tls (default $IDEMKIT_KAFKA_CA)")
	fs.StringVar(&f.cert, "kafka-cert", "", "PEM `file` of a TLS client certificate, with -kafka-key (default $IDEMKIT_KAFKA_CERT)")
	fs.StringVar(&f.key, "kafka-key", "", "PEM `file` of the client certificate's key (default $IDEMKIT_KAFKA_KEY)")
	fs.StringVar(&f.serverName, "kafka-server-name", "", "`name` to check in the brokers' certificates (default $IDEMKIT_KAFKA_SERVER_NAME)")
	fs.StringVar(&f.sasl, "kafka-sasl", "", "SASL `mechanism`: plain, scram-sha-256 or scram-sha-512 (default $IDEMKIT_KAFKA_SASL)")
	fs.StringVar(&f.user, "kafka-user", "", "SASL `user` (default $IDEMKIT_KAFKA_USER)")
	fs.StringVar(&f.passwordFile, "kafka-password-file", "", "`file` holding the SASL password (default $IDEMKIT_KAFKA_PASSWORD_FILE; else $IDEMKIT_KAFKA_PASSWORD)")
	fs.StringVar(&f.clientID, "kafka-client-id", "", "client.id the brokers see (default $IDEMKIT_KAFKA_CLIENT_ID, else idemkit-console)")
}

// fromEnv gives the flags not passed their environment defaults.
func fromEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for name, env := range envDefaults {
		if v := os.Getenv(env); v != "" && !set[name] {
			if err := fs.Set(name, v); err != nil {
				return usagef("$%s: %v", env, err)
			}
		}
	}
	return nil
}

// kafka is the connection setting the flags name (kafkaconn.Config).
func (f *flags) kafka() (kafkaconn.Config, error) {
	var brokers []string
	for _, b := range strings.Split(f.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		return kafkaconn.Config{}, usagef("no Kafka brokers: pass -brokers or set IDEMKIT_KAFKA_BROKERS")
	}
	kc := kafkaconn.Config{Brokers: brokers, ClientID: cmp.Or(f.clientID, "idemkit-console"), DialTimeout: 10 * time.Second}
	var err error
	if f.tls || f.ca != "" || f.cert != "" || f.key != "" || f.serverName != "" {
		if (f.cert == "") != (f.key == "") {
			return kc, usagef("-kafka-cert and -kafka-key go together")
		}
		if kc.TLS, err = kafkaconn.LoadTLS(kafkaconn.TLSFiles{CA: f.ca, Cert: f.cert, Key: f.key, ServerName: f.serverName}); err != nil {
			return kc, err
		}
	}
	if f.sasl == "" {
		if f.user != "" || f.passwordFile != "" {
			return kc, usagef("-kafka-user and -kafka-password-file need -kafka-sasl")
		}
		return kc, nil
	}
	mech, err := kafkaconn.ParseMechanism(f.sasl)
	if err != nil {
		return kc, usagef("-kafka-sasl: %q is not plain, scram-sha-256 or scram-sha-512", f.sasl)
	}
	if f.user == "" {
		return kc, usagef("-kafka-sasl %s needs -kafka-user (or $IDEMKIT_KAFKA_USER)", f.sasl)
	}
	password := os.Getenv("IDEMKIT_KAFKA_PASSWORD")
	if f.passwordFile != "" {
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return kc, fmt.Errorf("-kafka-password-file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	if password == "" {
		return kc, usagef("-kafka-sasl %s needs a password: set $IDEMKIT_KAFKA_PASSWORD or pass -kafka-password-file", f.sasl)
	}
	kc.SASL = &kafkaconn.SASL{Mechanism: mech, Username: f.user, Password: password}
	return kc, kc.Validate()
}

// The server's bounds: a client that trickles its request or leaves its
// connection idle is cut off, so that anyone who reaches the port cannot
// hold connections open. Forms are small; a response may take a page's
// reads (up to 2 minutes) and an action (console.ActionTimeout).
const (
	readTimeout    = 30 * time.Second
	writeTimeout   = 2*time.Minute + console.ActionTimeout + time.Minute
	idleTimeout    = 30 * time.Second
	maxHeaderBytes = 64 << 10
)

// tokenMin is the fewest characters of a chosen token.
const tokenMin = 32

// checkToken refuses a chosen token that is easy to guess or to mangle:
// shorter than tokenMin, holding whitespace, or one character repeated.
func checkToken(token string) error {
	switch {
	case len(token) < tokenMin:
		return usagef("IDEMKIT_CONSOLE_TOKEN must be at least %d characters (it has %d): "+
			"leave it unset and the console draws one", tokenMin, len(token))
	case strings.IndexFunc(token, unicode.IsSpace) >= 0:
		return usagef("IDEMKIT_CONSOLE_TOKEN must not hold whitespace")
	case strings.Trim(token, token[:1]) == "":
		return usagef("IDEMKIT_CONSOLE_TOKEN must not be one character repeated")
	}
	return nil
}

// run serves the console until ctx ends. ready, when set, receives the
// address it listens on.
func run(ctx context.Context, args []string, out io.Writer, ready chan<- string) error {
	fs := flag.NewFlagSet("idemkit-console", flag.ContinueOnError)
	fs.SetOutput(out)
	var f flags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return usagef("no arguments expected, got %q", fs.Args())
	}
	if err := fromEnv(fs); err != nil {
		return err
	}
	if f.database == "" {
		return usagef("no database: pass -database or set IDEMKIT_DATABASE_URL")
	}
	kc, err := f.kafka()
	if err != nil {
		return err
	}
	token, generated := os.Getenv("IDEMKIT_CONSOLE_TOKEN"), false
	if token == "" {
		b := make([]byte, 32)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("generate a token: %w", err)
		}
		token, generated = base64.RawURLEncoding.EncodeToString(b), true
	} else if err := checkToken(token); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, f.database)
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var topics []string
	if f.dlqTopics != "" {
		topics = strings.Split(f.dlqTopics, ",")
	}
	c, err := console.New(pool, &console.Config{Kafka: kc, Tables: migrate.Tables{Schema: f.schema}, ReadOnly: f.readOnly,
		SecureCookie: f.secureCookie, Authorize: console.TokenAuth(token, "token"), DLQSuffix: f.dlqSuffix, DLQTopics: topics, Logger: log})
	if err != nil {
		return usagef("%v", err)
	}
	defer c.Close()
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	fmt.Fprintf(out, "idemkit console on http://%s/\n", addr)
	if !addr.IP.IsLoopback() {
		fmt.Fprintf(out, "warning: listening beyond loopback (%s): put TLS in front of it\n", addr.IP)
	}
	if generated {
		fmt.Fprintf(out, "token (shown once; set IDEMKIT_CONSOLE_TOKEN to choose it): %s\n", token)
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: readTimeout, WriteTimeout: writeTimeout,
		IdleTimeout: idleTimeout, MaxHeaderBytes: maxHeaderBytes, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	if ready != nil {
		ready <- addr.String()
	}
	select {
	case err := <-done:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-done
	return err
}
