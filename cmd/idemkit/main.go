// Command idemkit operates idemkit's tables and topics: it applies the
// migrations; lists, inspects and replays dead letters; lists stuck HTTP
// idempotency records; shows and requeues dead outbox messages; lists the
// messages a NonBlocking consumer parked and makes them due again; purges
// processed-message records past their retention, or switches them to daily
// partitions and keeps those; shows and moves (rewinds, skips) a
// consumer's positions; and creates topics.
//
//	idemkit migrate up [-wait D] | down VERSION | status [-json]   -database URL [-schema S]
//	idemkit dlq list     -topic T.dlq [filters] [-json] [redaction]  -brokers B [-database URL]
//	idemkit dlq inspect  -topic T.dlq -id ID | -at P/O [-json] [redaction] -brokers B [-database URL]
//	idemkit dlq replay   -topic T.dlq [filters] [-dry-run] [-rate N] [-replay-limit N] [-max-outage D] [-retention D [-apply-beyond-horizon]] [-json] -brokers B -database URL
//	idemkit idemhttp stuck [-json] -database URL [-schema S] [-table T] [-limit N]
//	idemkit outbox stats|dead [-json] | retry ID... -database URL [-schema S] [-table T]
//	idemkit dedup purge -older-than D -database URL [-schema S] [-batch N]
//	idemkit dedup daily enable [-keep-days N] [-ahead-days N] | status [-json] | maintain [-json] -database URL [-schema S]
//	idemkit consumer positions -group G -topic T [-name N] [-json] -brokers B -database URL
//	idemkit consumer seek -group G -topic T TARGET [-partitions 0,2] [-recreated] [-force] [-dry-run] ...
//	idemkit consumer parked list  -topic T -name N [-key K]... [-json] [redaction] -database URL
//	idemkit consumer parked retry -topic T -name N (-key K... | -all) [-dry-run] [-json] -database URL
//	idemkit topic create TOPIC... [-partitions N] [-replicas N] -brokers B
//	idemkit status [-json] [thresholds] -brokers B -database URL
//	idemkit version [-json]
//
// consumer seek, not kafka-consumer-groups --reset-offsets, rewinds a
// consumer: it moves the PostgreSQL positions and the group's Kafka offsets
// together (the consumer starts at the later of the two). consumer parked
// retry only reschedules: the running consumer re-attempts each key's head
// and releases the key in order, through dedup and the handler.
//
// Help at every level: -h, --help or a "help" argument after any command or
// group ("idemkit dlq -h"), and "idemkit help COMMAND", print on stdout what
// it does and every flag with its description, and exit 0. Listings take
// -json. Payloads — message keys, values, headers and error texts in dlq
// list/inspect, consumer parked list and outbox dead — are redacted unless
// -show-payload: card-number-like runs of 13 to 19 digits keep their last
// four, sensitive JSON fields and headers (password, token, authorization,
// card, cvv, iban, ...; more with -redact-fields or $IDEMKIT_REDACT_FIELDS)
// are masked whole, and so are matches of -redact-regexp or
// $IDEMKIT_REDACT_REGEXP.
//
// -database and -brokers default to $IDEMKIT_DATABASE_URL and
// $IDEMKIT_KAFKA_BROKERS (help never prints their values: a URL may carry a
// password). Every Kafka command takes the connection setting of package
// kafkaconn: -kafka-tls, -kafka-ca FILE, -kafka-cert FILE -kafka-key FILE,
// -kafka-server-name, -kafka-sasl plain|scram-sha-256|scram-sha-512,
// -kafka-user, -kafka-password-file and -kafka-client-id, each defaulting to
// its $IDEMKIT_KAFKA_* variable (IDEMKIT_KAFKA_TLS, IDEMKIT_KAFKA_CA, ...);
// the password comes from $IDEMKIT_KAFKA_PASSWORD or -kafka-password-file,
// never from a flag, and is never printed. Brokers that refuse the
// credentials or certificates are one line naming them. A schema without idemkit's tables is one line naming it and
// "run idemkit migrate up". Exit status: 0 done, 1 failed (one line on
// stderr says why), 2 bad usage, 3 (status only) a threshold was crossed.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/outbox"
)

// usageError makes main exit 2. cmd is the command it concerns, whose
// synopsis main prints; empty: the whole usage.
type usageError struct{ msg, cmd string }

func (e *usageError) Error() string { return e.msg }

// helpRequest makes main print text on stdout and exit 0: -h at every level.
type helpRequest struct{ text string }

func (h *helpRequest) Error() string { return "help requested" }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// command is one of idemkit's commands.
type command struct {
	name     string // "dlq list"
	synopsis string // what follows "idemkit NAME" in the usage
	summary  string // one line: what it does
	doc      string // what `idemkit NAME -h` says above the flags; empty: summary
	run      func(ctx context.Context, c *command, args []string, out io.Writer) error
}

// sub is the command's last word: "list" for "dlq list".
func (c *command) sub() string { return c.name[strings.LastIndexByte(c.name, ' ')+1:] }

var commands []*command // filled by init: the commands refer to it for their help

func init() {
	commands = []*command{
		{name: "migrate up", synopsis: "[-wait D] [-database URL] [-schema S]", summary: "apply idemkit's migrations", run: migrateCmd},
		{name: "migrate down", synopsis: "VERSION [-database URL] [-schema S]", summary: "revert migrations down to VERSION (0: all)", run: migrateCmd},
		{name: "migrate status", synopsis: "[-json] [-database URL] [-schema S]", summary: "the versions applied and those this build knows", run: migrateCmd},
		{name: "dlq list", synopsis: "-topic T.dlq [filters] [-json] [redaction] [-brokers B] [kafka] [-database URL] [-schema S]", summary: "list dead letters and their state",
			doc: dlqListHelp, run: dlqCmd},
		{name: "dlq inspect", synopsis: "-topic T.dlq (-id ID | -at PARTITION/OFFSET) [-json] [redaction] [-brokers B] [kafka] [-database URL] [-schema S]",
			summary: "show a dead letter: origin, key, value, headers, history", doc: dlqInspectHelp, run: dlqCmd},
		{name: "dlq replay", synopsis: "-topic T.dlq [filters] [-dry-run] [-rate N] [-replay-limit N] [-max-outage D] [-retention D [-apply-beyond-horizon]] [-json] [-brokers B] [kafka] [-database URL] [-schema S]",
			summary: "write dead letters back to their origin topic", doc: dlqReplayHelp, run: dlqCmd},
		{name: "idemhttp stuck", synopsis: "[-json] [-limit N] [-database URL] [-schema S] [-table T]",
			summary: "list HTTP idempotency records still in flight after their lease", doc: stuckHelp, run: idemhttpCmd},
		{name: "outbox stats", synopsis: "[-json] [-database URL] [-schema S] [-table T]", summary: "the outbox backlog, its oldest message, the dead ones", run: outboxCmd},
		{name: "outbox dead", synopsis: "[-json] [redaction] [-database URL] [-schema S] [-table T]", summary: "list dead outbox messages with their errors", run: outboxCmd},
		{name: "outbox retry", synopsis: "ID... [-database URL] [-schema S] [-table T]",
			summary: "requeue dead outbox messages (with the messages of their key held behind them)", run: outboxCmd},
		{name: "dedup purge", synopsis: "-older-than D [-batch N] [-database URL] [-schema S]",
			summary: "delete processed-message records past their retention", doc: purgeHelp, run: dedupCmd},
		{name: "dedup daily enable", synopsis: "[-keep-days N] [-ahead-days N] [-database URL] [-schema S]",
			summary: "store UUIDv7 IDs by day from tomorrow on: retention drops whole days", doc: dailyEnableHelp, run: dailyCmd},
		{name: "dedup daily status", synopsis: "[-json] [-database URL] [-schema S]",
			summary: "the dedup layout and its daily partitions", doc: dailyStatusHelp, run: dailyCmd},
		{name: "dedup daily maintain", synopsis: "[-json] [-database URL] [-schema S]",
			summary: "create the daily partitions ahead, drop those past -keep-days", doc: dailyMaintainHelp, run: dailyCmd},
		{name: "consumer positions", synopsis: "-group G -topic T [-name N] [-json] [-brokers B] [kafka] [-database URL] [-schema S] [-table T]",
			summary: "where a consumer stands, per partition, in PostgreSQL and Kafka", doc: positionsHelp, run: consumerCmd},
		{name: "consumer seek", synopsis: "-group G -topic T [-name N] TARGET [-partitions 0,2] [-recreated] [-new] [-force] [-dry-run] [-brokers B] [kafka] [-database URL] [-schema S] [-table T]",
			summary: "rewind or skip a consumer: PostgreSQL positions and Kafka offsets together", doc: seekHelp, run: consumerCmd},
		{name: "consumer parked list", synopsis: "-topic T (-name N | -group G) [-partitions 0,2] [-key K]... [-limit N] [-json] [redaction] [-database URL] [-schema S]",
			summary: "list the messages a NonBlocking consumer parked", doc: parkedListHelp, run: parkedCmd},
		{name: "consumer parked retry", synopsis: "-topic T (-name N | -group G) (-key K... | -all) [-partitions 0,2] [-dry-run] [-json] [-database URL] [-schema S]",
			summary: "make parked keys due now: the consumer re-attempts them, in order", doc: parkedRetryHelp, run: parkedCmd},
		{name: "topic create", synopsis: "TOPIC... [-partitions N] [-replicas N] [-wait D] [-brokers B] [kafka]",
			summary: "create topics unless they exist, and wait until the cluster lists them", doc: topicCreateHelp, run: topicCmd},
		{name: "status", synopsis: "[-json] [thresholds] [-brokers B] [kafka] [-database URL] [-schema S]",
			summary: "one screen on everything; exit 3 when a threshold is crossed", doc: statusHelp, run: statusCmd},
		{name: "version", synopsis: "[-json]", summary: "the module version, its commit and the Go version it was built with", run: versionCmd},
	}
}

func findCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// usage is what `idemkit -h` prints.
func usage() string {
	var b strings.Builder
	b.WriteString("usage: idemkit COMMAND [flags]\n\ncommands:\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  idemkit %s\t%s\n", c.name, c.summary)
	}
	_ = tw.Flush()
	b.WriteString(usageNotes)
	return b.String()
}

const usageNotes = `
'idemkit COMMAND -h' (or --help, or 'idemkit help COMMAND') shows what a command
does and every flag with its description; 'idemkit dlq -h' lists a group's commands.
-database and -brokers default to $IDEMKIT_DATABASE_URL and $IDEMKIT_KAFKA_BROKERS.
Kafka commands reach TLS/SASL clusters with -kafka-tls, -kafka-ca, -kafka-cert/-kafka-key,
-kafka-sasl plain|scram-sha-256|scram-sha-512 and -kafka-user (or IDEMKIT_KAFKA_TLS,
IDEMKIT_KAFKA_CA, IDEMKIT_KAFKA_SASL, IDEMKIT_KAFKA_USER, ...); the password comes from
$IDEMKIT_KAFKA_PASSWORD or -kafka-password-file, never from a flag.
Listings take -json. Payloads (message keys, values, headers, error texts) are
redacted unless -show-payload is given: card-number-like digit runs, sensitive JSON
fields and headers, and -redact-fields / -redact-regexp matches are masked.
consumer seek is how to rewind (or skip) a consumer: it moves its PostgreSQL positions
and its group's Kafka offsets together. Do not use kafka-consumer-groups --reset-offsets:
the consumer starts at the later of the two, so a rewind of Kafka's alone is undone.
Exit status: 0 done, 1 failed (one line on stderr says why), 2 bad usage,
3 (status only) a threshold was crossed.
`

// synopsis is the usage of one command, or of the commands of a group.
func synopsis(name string) string {
	var b strings.Builder
	for _, c := range commands {
		if c.name == name || strings.HasPrefix(c.name, name+" ") {
			fmt.Fprintf(&b, "usage: idemkit %s %s\n", c.name, c.synopsis)
		}
	}
	return b.String()
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Everything the CLI prints goes through a termWriter: it shows data
	// from messages and records, which may carry terminal control sequences.
	stdout, stderr := newTermWriter(os.Stdout), newTermWriter(os.Stderr)
	exit := func(code int) {
		_ = stdout.Flush()
		_ = stderr.Flush()
		os.Exit(code)
	}
	defer func() {
		_ = stdout.Flush()
		_ = stderr.Flush()
	}()
	err := run(ctx, os.Args[1:], stdout)
	var (
		u *usageError
		h *helpRequest
		t *thresholdError
	)
	switch {
	case err == nil:
	case errors.As(err, &t):
		fmt.Fprintf(stderr, "idemkit: %s\n", t)
		exit(exitThreshold)
	case errors.As(err, &h):
		fmt.Fprint(stdout, h.text)
	case errors.As(err, &u) && u.cmd != "":
		hint := fmt.Sprintf("'idemkit %s -h' shows what it does and every flag.", u.cmd)
		if findCommand(u.cmd) == nil { // a group
			hint = fmt.Sprintf("'idemkit %s COMMAND -h' shows what a command does and every flag.", u.cmd)
		}
		fmt.Fprintf(stderr, "idemkit: %s\n%s%s\n", u.msg, synopsis(u.cmd), hint)
		exit(2)
	case errors.As(err, &u):
		fmt.Fprintf(stderr, "idemkit: %s\n%s", u.msg, usage())
		exit(2)
	default:
		fmt.Fprintf(stderr, "idemkit: %s\n", explain(err))
		exit(1)
	}
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

func isHelp(a string) bool {
	return a == "-h" || a == "-help" || a == "--help" || a == "help" || a == "--h"
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return usagef("name a command")
	}
	switch {
	case args[0] == "help" && len(args) > 1: // idemkit help dlq list
		return run(ctx, append(slices.Clone(args[1:]), "-h"), out)
	case isHelp(args[0]):
		return &helpRequest{usage()}
	case args[0] == "-version" || args[0] == "--version":
		args = append([]string{"version"}, args[1:]...)
	}
	// The longest command the words name, then a group's help or usage.
	for n := min(3, len(args)); n >= 1; n-- {
		name := strings.Join(args[:n], " ")
		if c := findCommand(name); c != nil {
			err := c.run(ctx, c, args[n:], out)
			if u := (*usageError)(nil); errors.As(err, &u) && u.cmd == "" {
				u.cmd = c.name
			}
			return err
		}
		if group := synopsis(name); group != "" {
			if len(args) > n && isHelp(args[n]) {
				return &helpRequest{group + "'idemkit " + name + " COMMAND -h' shows what a command does and every flag.\n"}
			}
			if len(args) > n && !strings.HasPrefix(args[n], "-") {
				return &usageError{msg: fmt.Sprintf("unknown command %q", strings.Join(args[:n+1], " ")), cmd: name}
			}
			return &usageError{msg: name + " needs a command", cmd: name}
		}
	}
	return usagef("unknown command %q", args[0])
}

// conn holds the connection flags.
type conn struct {
	database string
	brokers  string
	schema   string
	kafka    kafkaFlags
}

// kafkaFlags are the -kafka-* flags: how to reach the brokers (TLS, SASL).
// There is no password flag (a command line is seen by every user of the
// machine): the password comes from $IDEMKIT_KAFKA_PASSWORD or a file.
type kafkaFlags struct {
	tls          bool
	ca           string
	cert, key    string
	serverName   string
	sasl         string
	user         string
	passwordFile string
	clientID     string
}

// register registers -database, -schema and -brokers.
func (c *conn) register(fs *flag.FlagSet) {
	c.registerDB(fs)
	c.registerKafka(fs)
}

// registerDB registers -database and -schema. The default of -database is
// not shown: it may carry a password.
func (c *conn) registerDB(fs *flag.FlagSet) {
	fs.StringVar(&c.database, "database", "", "PostgreSQL URL (default $IDEMKIT_DATABASE_URL)")
	fs.StringVar(&c.schema, "schema", "public", "schema of idemkit's tables")
}

// registerKafka registers -brokers and the -kafka-* flags of the
// connection setting (package kafkaconn), each defaulting to its
// $IDEMKIT_KAFKA_* variable (see envDefaults).
func (c *conn) registerKafka(fs *flag.FlagSet) {
	k := &c.kafka
	fs.StringVar(&c.brokers, "brokers", "", "Kafka bootstrap addresses, comma-separated (default $IDEMKIT_KAFKA_BROKERS)")
	fs.BoolVar(&k.tls, "kafka-tls", false, "speak TLS to the brokers, trusting the system's CAs or -kafka-ca (default $IDEMKIT_KAFKA_TLS)")
	fs.StringVar(&k.ca, "kafka-ca", "", "PEM `file` of the CAs to trust; implies -kafka-tls (default $IDEMKIT_KAFKA_CA)")
	fs.StringVar(&k.cert, "kafka-cert", "", "PEM `file` of a TLS client certificate, with -kafka-key; implies -kafka-tls (default $IDEMKIT_KAFKA_CERT)")
	fs.StringVar(&k.key, "kafka-key", "", "PEM `file` of the client certificate's key (default $IDEMKIT_KAFKA_KEY)")
	fs.StringVar(&k.serverName, "kafka-server-name", "", "`name` to check in the brokers' certificates instead of their host (default $IDEMKIT_KAFKA_SERVER_NAME)")
	fs.StringVar(&k.sasl, "kafka-sasl", "", "SASL `mechanism`: plain, scram-sha-256 or scram-sha-512 (default $IDEMKIT_KAFKA_SASL)")
	fs.StringVar(&k.user, "kafka-user", "", "SASL `user` (default $IDEMKIT_KAFKA_USER)")
	fs.StringVar(&k.passwordFile, "kafka-password-file", "", "`file` holding the SASL password (default $IDEMKIT_KAFKA_PASSWORD_FILE; else the password is $IDEMKIT_KAFKA_PASSWORD)")
	fs.StringVar(&k.clientID, "kafka-client-id", "", "client.id the brokers see (default $IDEMKIT_KAFKA_CLIENT_ID, else idemkit)")
}

// envDefaults are the environment variables of the flags that have one.
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

// envKafkaPassword holds the SASL password when -kafka-password-file is
// not given.
const envKafkaPassword = "IDEMKIT_KAFKA_PASSWORD"

// fromEnv gives the flags of envDefaults their environment defaults when
// they were not passed. A value the flag refuses (IDEMKIT_KAFKA_TLS=maybe)
// is a usage error naming the variable.
func fromEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, name := range slices.Sorted(maps.Keys(envDefaults)) {
		env := envDefaults[name]
		if v := os.Getenv(env); v != "" && !set[name] && fs.Lookup(name) != nil {
			if err := fs.Set(name, v); err != nil {
				return usagef("$%s: %v", env, err)
			}
		}
	}
	return nil
}

// kafkaConn is the connection setting the -brokers and -kafka-* flags
// name. Flags that contradict each other are usage errors; a file that
// cannot be read is an error naming it. The password is never part of an
// error.
func (c *conn) kafkaConn() (kafkaconn.Config, error) {
	brokers, err := c.brokerList()
	if err != nil {
		return kafkaconn.Config{}, err
	}
	k := &c.kafka
	kc := kafkaconn.Config{Brokers: brokers, ClientID: cmp.Or(k.clientID, "idemkit"), DialTimeout: dial}
	if k.tls || k.ca != "" || k.cert != "" || k.key != "" || k.serverName != "" {
		if (k.cert == "") != (k.key == "") {
			return kc, usagef("-kafka-cert and -kafka-key go together")
		}
		if kc.TLS, err = kafkaconn.LoadTLS(kafkaconn.TLSFiles{CA: k.ca, Cert: k.cert, Key: k.key, ServerName: k.serverName}); err != nil {
			return kc, err
		}
	}
	if k.sasl == "" {
		if k.user != "" || k.passwordFile != "" {
			return kc, usagef("-kafka-user and -kafka-password-file need -kafka-sasl (plain, scram-sha-256 or scram-sha-512)")
		}
		return kc, nil
	}
	mech, err := kafkaconn.ParseMechanism(k.sasl)
	if err != nil {
		return kc, usagef("-kafka-sasl: %q is not plain, scram-sha-256 or scram-sha-512", k.sasl)
	}
	if k.user == "" {
		return kc, usagef("-kafka-sasl %s needs -kafka-user (or $IDEMKIT_KAFKA_USER)", k.sasl)
	}
	password := os.Getenv(envKafkaPassword)
	if k.passwordFile != "" {
		b, err := os.ReadFile(k.passwordFile)
		if err != nil {
			return kc, fmt.Errorf("-kafka-password-file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	if password == "" {
		return kc, usagef("-kafka-sasl %s needs a password: set $%s or pass -kafka-password-file", k.sasl, envKafkaPassword)
	}
	kc.SASL = &kafkaconn.SASL{Mechanism: mech, Username: k.user, Password: password}
	return kc, kc.Validate()
}

// dialKafka builds the connection setting and checks that the brokers
// answer a metadata request with it; it returns a client for the command,
// and the function that closes its connections.
func (c *conn) dialKafka(ctx context.Context) (kafkaconn.Config, *kafka.Client, func(), error) {
	kc, err := c.kafkaConn()
	if err != nil {
		return kc, nil, nil, err
	}
	t, err := kc.Transport()
	if err != nil {
		return kc, nil, nil, err
	}
	client := &kafka.Client{Addr: kc.Addr(), Timeout: dial, Transport: t}
	cctx, cancel := context.WithTimeout(ctx, dial)
	defer cancel()
	if _, err := client.Metadata(cctx, &kafka.MetadataRequest{Topics: []string{}}); err != nil {
		t.CloseIdleConnections()
		if werr := kc.Wrap(err); werr != err {
			return kc, nil, nil, werr // names the brokers, says what they refused
		}
		return kc, nil, nil, fmt.Errorf("Kafka at %s does not answer: %w", strings.Join(kc.Brokers, ","), err)
	}
	return kc, client, t.CloseIdleConnections, nil
}

func (c *conn) brokerList() ([]string, error) {
	var out []string
	for _, b := range strings.Split(c.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, usagef("no Kafka brokers: pass -brokers or set IDEMKIT_KAFKA_BROKERS")
	}
	return out, nil
}

// parse parses flags that may come after positional arguments too. -h,
// --help and a "help" among the arguments return the command's help.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) || (err == nil && len(fs.Args()) > 0 && fs.Arg(0) == "help") {
			return nil, &helpRequest{commandHelp(fs)}
		}
		if err != nil {
			return nil, usagef("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			if err := fromEnv(fs); err != nil {
				return nil, err
			}
			return pos, checkNames(fs)
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// commandHelp is what `idemkit COMMAND -h` prints: the synopsis, what the
// command does, every flag with its description.
func commandHelp(fs *flag.FlagSet) string {
	var b strings.Builder
	b.WriteString(synopsis(fs.Name()))
	if c := findCommand(fs.Name()); c != nil {
		doc := c.doc
		if doc == "" {
			doc = strings.ToUpper(c.summary[:1]) + c.summary[1:] + "."
		}
		fmt.Fprintf(&b, "\n%s\n", strings.TrimRight(doc, "\n"))
	}
	b.WriteString("\nflags:\n")
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
	return b.String()
}

// checkNames refuses an empty -schema or -table: each would otherwise
// silently mean the default (public, the default table).
func checkNames(fs *flag.FlagSet) error {
	var err error
	fs.Visit(func(f *flag.Flag) {
		if (f.Name == "schema" || f.Name == "table") && strings.TrimSpace(f.Value.String()) == "" && err == nil {
			err = usagef("-%s must not be empty", f.Name)
		}
	})
	return err
}

// explain returns err on one line, with the fix for an error users meet
// first: a table missing because the schema was never migrated (commands
// turn those into a notMigratedError naming the schema; this is the net
// under them).
func explain(err error) string {
	msg := oneLine(err)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42P01" && !strings.Contains(msg, "migrate up") { // undefined_table
		msg += ": run idemkit migrate up (with the same -schema) first"
	}
	return msg
}

// notMigratedError is a command's error on a schema without idemkit's
// tables, or with older versions of them: one line that names the schema
// and the fix, without PostgreSQL's SQLSTATE.
type notMigratedError struct {
	schema, what string
	err          error // what PostgreSQL or the package said
}

func (e *notMigratedError) Unwrap() error { return e.err }

func (e *notMigratedError) Error() string {
	return fmt.Sprintf("schema %s is not migrated (%s): run idemkit migrate up -schema %s", e.schema, e.what, e.schema)
}

// dbErr turns err into a notMigratedError when it says the schema lacks a
// table or a column (undefined_table, undefined_column, or a package's
// ErrNotMigrated); other errors pass unchanged.
func (c *conn) dbErr(err error) error {
	if err == nil {
		return nil
	}
	var pg *pgconn.PgError
	var what string
	switch {
	case errors.As(err, &pg) && pg.Code == "42P01": // undefined_table: relation "s.t" does not exist
		what = "no table " + strings.TrimSuffix(strings.TrimPrefix(pg.Message, "relation "), " does not exist")
	case errors.As(err, &pg) && pg.Code == "42703": // undefined_column
		what = "its tables are older than this build: " + pg.Message
	case errors.Is(err, dedup.ErrNotMigrated), errors.Is(err, outbox.ErrNotMigrated), errors.Is(err, idemhttp.ErrNotMigrated),
		errors.Is(err, consumer.ErrNotMigrated):
		what = "idemkit's tables are missing or older than this build"
	default:
		return err
	}
	return &notMigratedError{schema: c.schema, what: what, err: err}
}

// dial bounds how long a command waits for a server that does not answer.
const dial = 10 * time.Second
