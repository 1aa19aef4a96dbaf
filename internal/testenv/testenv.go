// Package testenv is the harness behind every idemkit test that claims
// behaviour against PostgreSQL or Kafka. It gives each test a fresh Postgres
// schema and unique Kafka topics and group IDs on real servers, and removes
// them when the test ends.
//
// The servers are named by two environment variables:
//
//	IDEMKIT_TEST_DATABASE_URL   a PostgreSQL URL whose user may create schemas
//	IDEMKIT_TEST_KAFKA_BROKERS  comma-separated Kafka bootstrap addresses
//
// scripts/dev start (or scripts/test, which calls it) starts local servers and
// prints these variables. When they are unset, a test module may plug in a
// Starter (the test/ module starts containers through testcontainers-go when a
// Docker engine is reachable). When no server can be had, the test binary
// stops with a one-line instruction: a missing server is never a skip.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/idemkit/idemkit/internal/topicscan"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
)

// Environment variables read by the harness.
const (
	EnvDatabaseURL  = "IDEMKIT_TEST_DATABASE_URL"
	EnvKafkaBrokers = "IDEMKIT_TEST_KAFKA_BROKERS"
)

// Instruction is the one line printed when no server is available.
const Instruction = "idemkit tests need real PostgreSQL and Kafka: run ./scripts/test from the repository root " +
	"(it installs and starts them), or start them with scripts/dev start and set " +
	EnvDatabaseURL + " and " + EnvKafkaBrokers + " as `scripts/dev env` prints"

// Servers names the servers the tests use.
type Servers struct {
	DatabaseURL string
	Brokers     []string
}

// Starter starts servers when the environment names none; stop releases them.
type Starter func(ctx context.Context) (s Servers, stop func(), err error)

var (
	mu      sync.Mutex
	servers *Servers
)

// Main is the body of a package's TestMain: it finds the servers (from the
// environment, else through start when it is non-nil), runs the tests, checks
// with goleak that no goroutine outlived them, and exits. It prints
// Instruction and exits 1 when no server can be had.
func Main(m *testing.M, start Starter) {
	os.Exit(run(m, start))
}

func run(m *testing.M, start Starter) int {
	stop := func() {}
	s, ok := fromEnv()
	if !ok && start != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		started, stopServers, err := start(ctx)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "testenv: %v\n%s\n", err, Instruction)
			return 1
		}
		s, ok, stop = started, true, stopServers
	}
	if !ok {
		fmt.Fprintln(os.Stderr, Instruction)
		return 1
	}
	mu.Lock()
	servers = &s
	mu.Unlock()
	code := m.Run()
	stop()
	// kafka-go's default transport (used by Writers and Clients that name no
	// Transport) pools connections process-wide; close them before looking
	// for goroutines that outlived the tests.
	if t, ok := kafka.DefaultTransport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: goroutines outlived the tests: %v\n", err)
			return 1
		}
	}
	return code
}

func fromEnv() (Servers, bool) {
	url := strings.TrimSpace(os.Getenv(EnvDatabaseURL))
	brokers := splitBrokers(os.Getenv(EnvKafkaBrokers))
	if url == "" || len(brokers) == 0 {
		return Servers{}, false
	}
	return Servers{DatabaseURL: url, Brokers: brokers}, true
}

func splitBrokers(v string) []string {
	var out []string
	for _, b := range strings.Split(v, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

func current(tb testing.TB) Servers {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if servers != nil {
		return *servers
	}
	// A package whose TestMain does not call Main still gets the environment.
	if s, ok := fromEnv(); ok {
		servers = &s
		return s
	}
	tb.Fatal(Instruction)
	return Servers{}
}

// DatabaseURL returns the URL of the test PostgreSQL server.
func DatabaseURL(tb testing.TB) string { return current(tb).DatabaseURL }

// Brokers returns the Kafka bootstrap addresses.
func Brokers(tb testing.TB) []string { return current(tb).Brokers }

var unsafeChars = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// Name returns a name unique to this test run, safe as a Postgres identifier
// and as a Kafka topic or group ID: prefix, a slug of the test name, random hex.
func Name(tb testing.TB, prefix string) string {
	tb.Helper()
	slug := strings.ToLower(strings.Trim(unsafeChars.ReplaceAllString(tb.Name(), "_"), "_"))
	if len(slug) > 30 {
		slug = slug[:30]
	}
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("testenv: random name: %v", err)
	}
	return prefix + "_" + slug + "_" + hex.EncodeToString(b[:])
}

// DB is a fresh schema on the test server, dropped when the test ends.
type DB struct {
	// Pool connects with search_path set to '' so that any table name the
	// code forgets to qualify fails loudly.
	Pool *pgxpool.Pool
	// Schema is the test's own schema.
	Schema string
}

// Table returns schema.name, quoted.
func (d *DB) Table(name string) string { return pgx.Identifier{d.Schema, name}.Sanitize() }

// NewDB creates a schema for the test, runs each setup function on it (for
// example the library's migrations), and drops the schema at cleanup.
func NewDB(tb testing.TB, setup ...func(ctx context.Context, pool *pgxpool.Pool, schema string) error) *DB {
	tb.Helper()
	url := DatabaseURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	schema := Name(tb, "t")
	admin, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("testenv: connect to %s: %v\n%s", EnvDatabaseURL, err, Instruction)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		tb.Fatalf("testenv: create schema: %v", err)
	}
	tb.Cleanup(func() { dropSchema(tb, url, schema) })

	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatalf("testenv: parse %s: %v", EnvDatabaseURL, err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("testenv: pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	for _, f := range setup {
		if err := f(ctx, pool, schema); err != nil {
			tb.Fatalf("testenv: setup schema %s: %v", schema, err)
		}
	}
	return &DB{Pool: pool, Schema: schema}
}

// ExampleSchema is for Example functions, which get no testing.TB: it
// returns a pool on the test server (with an empty search_path) and the name of a
// schema that does not exist yet; drop removes the schema and closes the
// pool. It panics when no server is available.
func ExampleSchema() (pool *pgxpool.Pool, schema string, drop func()) {
	mu.Lock()
	s := servers
	mu.Unlock()
	if s == nil {
		panic(Instruction)
	}
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(s.DatabaseURL)
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	schema = "ex_" + hex.EncodeToString(b[:])
	return pool, schema, func() {
		defer pool.Close()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			panic(err)
		}
	}
}

// ExampleTopic is for Example functions: it creates a topic with the given
// partitions on the test brokers and returns the brokers, the topic, and drop,
// which deletes it. It panics when no server is available.
func ExampleTopic(partitions int) (brokers []string, topic string, drop func()) {
	mu.Lock()
	s := servers
	mu.Unlock()
	if s == nil {
		panic(Instruction)
	}
	var b [5]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	topic = "idemkit_example_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(s.Brokers...), Timeout: 30 * time.Second}
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err == nil {
		err = WaitTopic(ctx, client, topic, partitions)
	}
	if err != nil {
		panic(err)
	}
	return s.Brokers, topic, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
	}
}

func dropSchema(tb testing.TB, url, schema string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Errorf("testenv: drop schema %s: %v", schema, err)
		return
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		tb.Errorf("testenv: drop schema %s: %v", schema, err)
	}
}

// Kafka returns the connection setting of the test brokers: their
// PLAINTEXT listener, no TLS, no SASL.
func Kafka(tb testing.TB) kafkaconn.Config { return kafkaconn.Config{Brokers: Brokers(tb)} }

// Environment variables naming the SASL_SSL listener of the test broker
// (scripts/dev start writes them into .dev/env).
const (
	EnvKafkaSASLBrokers = "IDEMKIT_TEST_KAFKA_SASL_BROKERS"
	EnvKafkaCA          = "IDEMKIT_TEST_KAFKA_CA"
	EnvKafkaUser        = "IDEMKIT_TEST_KAFKA_USER"
	EnvKafkaPassword    = "IDEMKIT_TEST_KAFKA_PASSWORD"
)

// SASL returns the connection setting of the test broker's SASL_SSL
// listener: TLS trusting $IDEMKIT_TEST_KAFKA_CA, SCRAM-SHA-512 as
// $IDEMKIT_TEST_KAFKA_USER. A variable that is not set fails the test at
// once with the fix: the SASL tests never skip.
func SASL(tb testing.TB) kafkaconn.Config {
	tb.Helper()
	var missing []string
	for _, v := range []string{EnvKafkaSASLBrokers, EnvKafkaCA, EnvKafkaUser, EnvKafkaPassword} {
		if os.Getenv(v) == "" {
			missing = append(missing, v)
		}
	}
	if len(missing) > 0 {
		tb.Fatalf("testenv: %s not set: run scripts/dev start (it starts Kafka with a SASL_SSL listener; "+
			"restart a broker an older scripts/dev started: scripts/dev stop first) and source .dev/env", strings.Join(missing, ", "))
	}
	conf, err := kafkaconn.LoadTLS(kafkaconn.TLSFiles{CA: os.Getenv(EnvKafkaCA)})
	if err != nil {
		tb.Fatalf("testenv: %v: run scripts/dev start", err)
	}
	return kafkaconn.Config{Brokers: splitBrokers(os.Getenv(EnvKafkaSASLBrokers)), TLS: conf,
		SASL: &kafkaconn.SASL{Mechanism: kafkaconn.ScramSHA512, Username: os.Getenv(EnvKafkaUser),
			Password: os.Getenv(EnvKafkaPassword)}}
}

// Client returns a kafka-go client for the test brokers.
func Client(tb testing.TB) *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(Brokers(tb)...), Timeout: 30 * time.Second}
}

// NewTopic creates a topic unique to the test with the given partition count,
// waits until every partition has a leader, and deletes it at cleanup.
func NewTopic(tb testing.TB, partitions int) string {
	tb.Helper()
	topic := Name(tb, "idemkit")
	CreateTopic(tb, topic, partitions)
	return topic
}

// CreateTopic creates the named topic (replication factor 1), waits until
// every partition has a leader, and deletes it at cleanup.
func CreateTopic(tb testing.TB, topic string, partitions int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := Client(tb)
	resp, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
	}}})
	if err == nil {
		err = resp.Errors[topic]
	}
	if err != nil {
		tb.Fatalf("testenv: create topic %s: %v", topic, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{topic}})
		if err == nil {
			err = resp.Errors[topic]
		}
		if err != nil {
			tb.Errorf("testenv: delete topic %s: %v", topic, err)
		}
	})
	if err := WaitTopic(ctx, client, topic, partitions); err != nil {
		tb.Fatalf("testenv: %v", err)
	}
}

// ReadAll returns every message of topic on brokers, partition after
// partition, each in offset order, without a consumer group. A broker that
// just restarted may fail for a moment: ReadAll tries for up to 30 seconds.
func ReadAll(tb testing.TB, brokers []string, topic string) []kafka.Message {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []kafka.Message
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; {
		out = out[:0]
		client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 10 * time.Second}
		err = topicscan.Scan(ctx, client, topic, func(m kafka.Message) error {
			out = append(out, m)
			return nil
		})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		tb.Fatalf("testenv: read %s: %v", topic, err)
	}
	return out
}

// WaitTopic waits until the topic's metadata lists the given number of
// partitions, each with a leader.
func WaitTopic(ctx context.Context, client *kafka.Client, topic string, partitions int) error {
	var last error
	for {
		md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		switch {
		case err != nil:
			last = err
		case len(md.Topics) != 1 || md.Topics[0].Error != nil:
			last = errors.New("topic not in metadata yet")
			if len(md.Topics) == 1 && md.Topics[0].Error != nil {
				last = md.Topics[0].Error
			}
		default:
			ready := 0
			for _, p := range md.Topics[0].Partitions {
				if p.Error == nil && p.Leader.ID >= 0 && p.Leader.Host != "" {
					ready++
				}
			}
			if ready == partitions {
				return nil
			}
			last = fmt.Errorf("%d of %d partitions have a leader", ready, partitions)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("topic %s not ready: %v: %w", topic, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Logs is a slog destination for tests: it keeps every record, as JSON
// fields, for the test to count, and passes it on to t.Log. Safe for
// concurrent use.
type Logs struct {
	tb   testing.TB
	mu   sync.Mutex
	recs []map[string]any
}

// NewLogs returns a Logs and a logger (Info and above) that writes to it.
func NewLogs(tb testing.TB) (*Logs, *slog.Logger) {
	l := &Logs{tb: tb}
	return l, slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// Write takes one JSON record.
func (l *Logs) Write(b []byte) (int, error) {
	var rec map[string]any
	if err := json.Unmarshal(b, &rec); err != nil {
		return 0, err
	}
	l.mu.Lock()
	l.recs = append(l.recs, rec)
	l.mu.Unlock()
	l.tb.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// Count returns how many records have the message msg and, when op is not
// empty, an "op" attribute containing op.
func (l *Logs) Count(msg, op string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, rec := range l.recs {
		if rec["msg"] != msg {
			continue
		}
		if got, _ := rec["op"].(string); op == "" || strings.Contains(got, op) {
			n++
		}
	}
	return n
}

// CountFunc returns how many records have the message msg and satisfy f,
// which gets the record's fields (as JSON decodes them).
func (l *Logs) CountFunc(msg string, f func(rec map[string]any) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, rec := range l.recs {
		if rec["msg"] == msg && f(rec) {
			n++
		}
	}
	return n
}

// Migrate is a NewDB setup that applies every idemkit migration to the
// test's schema: testenv.NewDB(t, testenv.Migrate).
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	if err != nil {
		return err
	}
	_, err = m.Up(ctx)
	return err
}

// PartPool is a pool of its own for one part of a fault test (a runner, a
// relay), on url, with at most maxConns connections, an empty search_path (a
// table name the code forgets to qualify fails) and name as
// application_name (so that a test can find or kill its backends). It is
// closed when the test ends.
func PartPool(tb testing.TB, ctx context.Context, url, name string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}
