// Command idemkit operates idemkit's tables and topics: it applies the
// migrations; lists, inspects and replays dead letters; lists stuck HTTP
// idempotency records; shows and requeues parked outbox messages; purges
// processed-message records past their retention; and shows and moves
// (rewinds, skips) a consumer's positions.
//
//	idemkit migrate up|down VERSION|status   -database URL [-schema S]
//	idemkit dlq list     -topic T.dlq [filters]        -brokers B [-database URL]
//	idemkit dlq inspect  -topic T.dlq -id ID | -at P/O -brokers B
//	idemkit dlq replay   -topic T.dlq [filters] [-dry-run] [-rate N] [-replay-limit N] [-max-outage D] -brokers B -database URL
//	idemkit idemhttp stuck -database URL [-schema S] [-table T] [-limit N]
//	idemkit outbox stats|parked|retry ID... -database URL [-schema S] [-table T]
//	idemkit dedup purge -older-than D -database URL [-schema S] [-batch N]
//	idemkit consumer positions -group G -topic T [-name N] [-json] -brokers B -database URL
//	idemkit consumer seek -group G -topic T TARGET [-partitions 0,2] [-recreated] [-force] [-dry-run] ...
//	idemkit status [-json] [thresholds] -brokers B -database URL
//
// consumer seek, not kafka-consumer-groups --reset-offsets, rewinds a
// consumer: it moves the PostgreSQL positions and the group's Kafka offsets
// together (the consumer starts at the later of the two).
//
// -database and -brokers default to $IDEMKIT_DATABASE_URL and
// $IDEMKIT_KAFKA_BROKERS. -h after any command shows its flags. Exit status:
// 0 done, 1 failed (one line on stderr says why), 2 bad usage, 3 (status
// only) a threshold was crossed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// usageError makes main exit 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// helpRequest makes main print text on stdout and exit 0: -h at every level.
type helpRequest struct{ text string }

func (h *helpRequest) Error() string { return "help requested" }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

const usage = `usage:
  idemkit migrate up|status            [-database URL] [-schema S]
  idemkit migrate down VERSION         [-database URL] [-schema S]
  idemkit dlq list    -topic T.dlq     [-brokers B] [-database URL] [filters]
  idemkit dlq inspect -topic T.dlq     (-id ID | -at PARTITION/OFFSET) [-brokers B]
  idemkit dlq replay  -topic T.dlq     [-brokers B] [-database URL] [filters] [-dry-run] [-rate N] [-replay-limit N] [-max-outage D]
  idemkit idemhttp stuck               [-database URL] [-schema S] [-table T] [-limit N]
  idemkit outbox stats|parked          [-database URL] [-schema S] [-table T]
  idemkit outbox retry ID...           [-database URL] [-schema S] [-table T]
  idemkit dedup purge -older-than D    [-database URL] [-schema S] [-batch N]
  idemkit consumer positions -group G -topic T [-name N] [-json]         [-brokers B] [-database URL] [-schema S] [-table T]
  idemkit consumer seek      -group G -topic T [-name N] TARGET [-partitions 0,2]
                             [-recreated] [-new] [-force] [-dry-run]    [-brokers B] [-database URL] [-schema S] [-table T]
  idemkit status [-json] [-max-lag N] [-max-parked-age D] [-max-outbox-age D] [-max-stuck N] [-max-dlq N]
                 [-retention D] [-dlq-suffix S]                         [-brokers B] [-database URL] [-schema S]
filters: -message-id ID -origin TOPIC -error TEXT -since RFC3339 -until RFC3339
TARGET: -to-offset N | -to-time RFC3339 | -to-earliest | -to-latest
-database and -brokers default to $IDEMKIT_DATABASE_URL and $IDEMKIT_KAFKA_BROKERS.
replay writes each selected dead letter back to its origin topic (the consumer's dedup
makes repeats harmless; one without message ID goes back too, and the consumer applies
its MissingID policy again) and records who replayed what; one whose replay rounds are
used up is parked instead. To re-run a handler in-process, use dlq.Reprocessor with
Mode Redrive from Go.
consumer seek is how to rewind (or skip) a consumer: it moves its PostgreSQL positions
and its group's Kafka offsets together. Do not use kafka-consumer-groups --reset-offsets:
the consumer starts at the later of the two, so a rewind of Kafka's alone is undone.
-h after a command shows its flags and what it does.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	var (
		u *usageError
		h *helpRequest
		t *thresholdError
	)
	switch {
	case err == nil:
	case errors.As(err, &t):
		fmt.Fprintf(os.Stderr, "idemkit: %s\n", t)
		os.Exit(exitThreshold)
	case errors.As(err, &h):
		fmt.Fprint(os.Stdout, h.text)
	case errors.As(err, &u):
		fmt.Fprintf(os.Stderr, "idemkit: %s\n%s", u.msg, usage)
		os.Exit(2)
	default:
		fmt.Fprintf(os.Stderr, "idemkit: %s\n", explain(err))
		os.Exit(1)
	}
}

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) >= 1 && args[0] == "status" { // the one command of one word
		return statusCmd(ctx, args[1:], out)
	}
	for _, a := range args[:min(2, len(args))] {
		if a == "-h" || a == "-help" || a == "--help" || a == "help" {
			return &helpRequest{usage}
		}
	}
	if len(args) < 2 {
		return usagef("name a command")
	}
	switch args[0] + " " + args[1] {
	case "migrate up", "migrate status", "migrate down":
		return migrateCmd(ctx, args[1], args[2:], out)
	case "dlq list", "dlq inspect", "dlq replay":
		return dlqCmd(ctx, args[1], args[2:], out)
	case "idemhttp stuck":
		return idemhttpCmd(ctx, args[1], args[2:], out)
	case "outbox stats", "outbox parked", "outbox retry":
		return outboxCmd(ctx, args[1], args[2:], out)
	case "dedup purge":
		return dedupCmd(ctx, args[1], args[2:], out)
	case "consumer positions", "consumer seek":
		return consumerCmd(ctx, args[1], args[2:], out)
	}
	return usagef("unknown command %q", strings.Join(args[:2], " "))
}

// common flags
type conn struct {
	database string
	brokers  string
	schema   string
}

func (c *conn) register(fs *flag.FlagSet) {
	fs.StringVar(&c.database, "database", os.Getenv("IDEMKIT_DATABASE_URL"), "PostgreSQL URL")
	fs.StringVar(&c.brokers, "brokers", os.Getenv("IDEMKIT_KAFKA_BROKERS"), "Kafka bootstrap addresses, comma-separated")
	fs.StringVar(&c.schema, "schema", "public", "schema of idemkit's tables")
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

// commandHelp is what `idemkit COMMAND -h` says above the flags, by command.
var commandHelp = map[string]string{
	"consumer positions": positionsHelp,
	"consumer seek":      seekHelp,
	"status":             statusHelp,
}

// parse parses flags that may come after positional arguments too.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			var b strings.Builder
			fmt.Fprintf(&b, "usage: idemkit %s [flags]\n", fs.Name())
			if doc := commandHelp[fs.Name()]; doc != "" {
				fmt.Fprintf(&b, "\n%s\n", doc)
			}
			b.WriteString("flags:\n")
			fs.SetOutput(&b)
			fs.PrintDefaults()
			return nil, &helpRequest{b.String()}
		}
		if err != nil {
			return nil, usagef("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, checkNames(fs)
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
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
// first: a table missing because the schema was never migrated.
func explain(err error) string {
	msg := oneLine(err)
	var pg *pgconn.PgError
	if errors.As(err, &pg) && pg.Code == "42P01" && !strings.Contains(msg, "migrate up") { // undefined_table
		msg += ": run idemkit migrate up (with the same -schema) first"
	}
	return msg
}

// dial bounds how long a command waits for a server that does not answer.
const dial = 10 * time.Second
