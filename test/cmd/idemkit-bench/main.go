// Command idemkit-bench is idemkit's end-to-end benchmark: a
// backlog of messages on a multi-partition topic, consumed by idemkit's
// runner into PostgreSQL (dedup claim + one business upsert per message), in
// four modes (default settings; one transaction per message; batched with the
// per-message handler; batched with a set-based batch handler), next to a
// Watermill peer doing the same effect (test/peers/watermill, its own module)
// and to the same SQL run against PostgreSQL alone, with the same batching and
// no Kafka nor framework. A steady-rate phase then measures the latency from
// produce to effect commit of every mode at several rates.
//
// It runs against the servers the tests use (IDEMKIT_TEST_DATABASE_URL,
// IDEMKIT_TEST_KAFKA_BROKERS); scripts/bench starts the development servers
// and runs it. Each scenario runs in a child process (this same binary) so
// that its peak RSS is its own. Every scenario starts from a fresh schema,
// and its result is checked: the sum of balances and the number of claimed
// IDs must match what was produced, else the run fails.
//
// The machine is shared with PostgreSQL and Kafka: the figures are ratios
// measured in one run, not absolute capacities.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// childEnv carries a childSpec (JSON) to a child process.
const childEnv = "IDEMKIT_BENCH_CHILD"

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec))
	}
	os.Exit(parentMain())
}

// options are the command's flags.
type options struct {
	messages   int
	partitions int
	batch      int
	accounts   int
	rates      []int
	steady     time.Duration
	watermill  string
	timeout    time.Duration
	scenarios  []string
	jsonPath   string
	profileDir string
	repeat     int
	processes  []int
}

func parseFlags() (*options, error) {
	o := &options{}
	var list, rates, processes string
	fs := flag.NewFlagSet("idemkit-bench", flag.ContinueOnError)
	fs.IntVar(&o.messages, "messages", 100_000, "messages in the backlog (and synthesized for the PostgreSQL-alone scenarios)")
	fs.IntVar(&o.partitions, "partitions", 6, "topic partitions; also the PostgreSQL-alone workers and each process's pool size")
	fs.IntVar(&o.batch, "batch", 500, "messages per transaction in the batched scenarios (consumer.Config.BatchSize)")
	fs.IntVar(&o.accounts, "accounts", 1000, "distinct business rows (message keys) the messages update")
	fs.StringVar(&rates, "rates", "1000,2000,5000", "comma-separated rates (msgs/s) of the steady-rate phase; every steady scenario runs at each")
	fs.DurationVar(&o.steady, "steady", 20*time.Second, "duration of one steady-rate run")
	fs.StringVar(&o.watermill, "watermill", "", "the Watermill peer's binary; by default it is built from test/peers/watermill")
	fs.DurationVar(&o.timeout, "timeout", 20*time.Minute, "longest a single scenario may take")
	fs.StringVar(&list, "scenarios", "all", "comma-separated scenarios to run (\"steady\": every steady-* one): "+
		strings.Join(scenarioNames(), ", "))
	fs.StringVar(&o.jsonPath, "json", "", "also write the results as JSON to this file")
	fs.IntVar(&o.repeat, "repeat", 3, "rounds of every selected scenario (interleaved); figures are each scenario's median round")
	fs.StringVar(&processes, "processes", "1,2,4,8", "comma-separated process counts of the scaling phase (scenario \"scale\"; use -partitions 24)")
	fs.StringVar(&o.profileDir, "cpuprofile", "", "write each scenario's CPU profile to DIR/SCENARIO.cpu.prof")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: idemkit-bench [flags]\n\n"+
			"Needs %s and %s (scripts/bench sets them).\n\n", envDatabaseURL, envKafkaBrokers)
		fs.PrintDefaults()
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	switch {
	case o.partitions < 1:
		return nil, fmt.Errorf("-partitions %d < 1", o.partitions)
	case o.messages < o.partitions:
		return nil, fmt.Errorf("-messages %d < -partitions %d", o.messages, o.partitions)
	case o.repeat < 1:
		return nil, fmt.Errorf("-repeat %d < 1", o.repeat)
	case o.batch < 2:
		return nil, fmt.Errorf("-batch %d < 2: the batched scenarios need batches", o.batch)
	case o.accounts < 1:
		return nil, fmt.Errorf("-accounts %d < 1", o.accounts)
	case o.steady <= 0:
		return nil, fmt.Errorf("-steady %s <= 0", o.steady)
	case o.timeout <= 0:
		return nil, fmt.Errorf("-timeout %s <= 0", o.timeout)
	}
	for _, v := range strings.Split(rates, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		r, err := strconv.Atoi(v)
		if err != nil || r < 1 {
			return nil, fmt.Errorf("-rates: %q is not a positive rate", v)
		}
		o.rates = append(o.rates, r)
	}
	if len(o.rates) == 0 {
		return nil, fmt.Errorf("-rates: none given")
	}

	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
		case s == "all": // every scenario but the scaling phase, which wants its own -partitions
			for _, sc := range scenarios {
				if sc.kind != kindScale {
					o.scenarios = append(o.scenarios, sc.name)
				}
			}
		case s == "steady": // every steady-rate scenario
			for _, sc := range scenarios {
				if sc.kind == kindSteady {
					o.scenarios = append(o.scenarios, sc.name)
				}
			}
		case findScenario(s) == nil:
			return nil, fmt.Errorf("-scenarios: unknown scenario %q (known: %s)", s, strings.Join(scenarioNames(), ", "))
		default:
			o.scenarios = append(o.scenarios, s)
		}
	}
	if len(o.scenarios) == 0 {
		return nil, fmt.Errorf("-scenarios: none given")
	}
	for _, v := range strings.Split(processes, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || (n > o.partitions && slices.Contains(o.scenarios, "scale")) {
			return nil, fmt.Errorf("-processes: %q is not a count from 1 to -partitions (%d)", v, o.partitions)
		}
		o.processes = append(o.processes, n)
	}
	if len(o.processes) == 0 {
		return nil, fmt.Errorf("-processes: none given")
	}
	return o, nil
}

func parentMain() int {
	o, err := parseFlags()
	if err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintln(os.Stderr, "idemkit-bench:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runBench(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-bench:", err)
		return 1
	}
	return 0
}

// kind is what a scenario exercises.
type kind int

const (
	kindConsumer kind = iota + 1 // the runner over a backlog on Kafka
	kindPG                       // the same SQL on PostgreSQL alone
	kindPeer                     // the Watermill peer over a backlog on Kafka
	kindSteady                   // the runner (or the peer) at steady produce rates
	kindScale                    // several runner processes of one group
)

// pgMode is how a PostgreSQL-alone scenario writes one transaction.
type pgMode int

const (
	pgPerMessage             pgMode = iota + 1 // BEGIN, claim one, upsert one, COMMIT
	pgBatchedEach                              // BEGIN, claim batch, one upsert per message, COMMIT
	pgBatchedSavepoint                         // as pgBatchedEach with SAVEPOINT/RELEASE around each upsert
	pgBatchedSavepointMerged                   // the same with each RELEASE sent with the next SAVEPOINT
	pgBatchedSet                               // BEGIN, claim batch, one set-based upsert, COMMIT
	pgMinimal                                  // BEGIN, claim one without position, upsert one, COMMIT (the peer's SQL)
)

// scenario is one measured configuration.
type scenario struct {
	name         string
	title        string
	kind         kind
	batched      bool   // BatchSize = -batch (consumer)
	batchHandler bool   // BatchHandler with a set-based upsert (consumer)
	defaults     bool   // consumer.Config as it comes: adaptive batches, per-message handler
	peer         bool   // the Watermill peer instead of idemkit's runner
	pg           pgMode // PostgreSQL alone
	base         string // the per-message scenario of the same kind, for "× per-message"
	pgAlone      string // the PostgreSQL-alone scenario with the same SQL and batching
}

// scenarios in the order they run: each consumer scenario next to its
// PostgreSQL-alone counterpart, so that a drift in the machine's load hits
// both alike.
var scenarios = []scenario{
	{name: "default", title: "consumer: default settings (only the required fields set)", kind: kindConsumer,
		defaults: true, base: "per-message", pgAlone: "pg-batched-each"},
	{name: "per-message", title: "consumer: BatchSize 1 (one transaction per message)", kind: kindConsumer,
		base: "per-message", pgAlone: "pg-per-message"},
	{name: "pg-per-message", title: "PG alone: per-message transactions", kind: kindPG, pg: pgPerMessage,
		base: "pg-per-message"},
	{name: "watermill", title: "Watermill peer: router + watermill-kafka, one transaction per message", kind: kindPeer,
		peer: true, base: "per-message", pgAlone: "pg-minimal"},
	{name: "pg-minimal", title: "PG alone: per-message transactions, claim without position (the peer's SQL)",
		kind: kindPG, pg: pgMinimal, base: "pg-per-message"},
	{name: "batched", title: "consumer: BatchSize 500, per-message handler", kind: kindConsumer, batched: true,
		base: "per-message", pgAlone: "pg-batched-each"},
	{name: "pg-batched-each", title: "PG alone: batched claim, upsert per message", kind: kindPG, pg: pgBatchedEach,
		base: "pg-per-message"},
	{name: "pg-batched-savepoint", title: "PG alone: batched claim, SAVEPOINT + upsert + RELEASE per message",
		kind: kindPG, pg: pgBatchedSavepoint, base: "pg-per-message"},
	{name: "pg-batched-savepoint-merged", title: "PG alone: batched claim, SAVEPOINT + upsert per message, " +
		"RELEASE sent with the next SAVEPOINT", kind: kindPG, pg: pgBatchedSavepointMerged, base: "pg-per-message"},
	{name: "batch-handler", title: "consumer: BatchSize 500, batch handler (set-based upsert)", kind: kindConsumer,
		batched: true, batchHandler: true, base: "per-message", pgAlone: "pg-batched"},
	{name: "pg-batched", title: "PG alone: batched claim, set-based upsert", kind: kindPG, pg: pgBatchedSet,
		base: "pg-per-message"},
	// Steady rates: each runs once per -rates value, after the throughput rounds.
	{name: "steady-default", title: "default settings", kind: kindSteady, defaults: true},
	{name: "steady-per-message", title: "BatchSize 1", kind: kindSteady},
	{name: "steady-batched", title: "BatchSize 500, per-message handler", kind: kindSteady, batched: true},
	{name: "steady-batch-handler", title: "BatchSize 500, batch handler", kind: kindSteady, batched: true,
		batchHandler: true},
	{name: "steady-watermill", title: "Watermill peer", kind: kindSteady, peer: true},
	// Horizontal scaling: once per -processes count and round, after the rest.
	{name: "scale", title: "N consumer processes of one group, default settings", kind: kindScale, defaults: true},
}

func scenarioNames() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return names
}

func findScenario(name string) *scenario {
	for i := range scenarios {
		if scenarios[i].name == name {
			return &scenarios[i]
		}
	}
	return nil
}

// selected returns the chosen scenarios in run order, each once.
func (o *options) selected() []*scenario {
	var out []*scenario
	for i := range scenarios {
		if slices.Contains(o.scenarios, scenarios[i].name) {
			out = append(out, &scenarios[i])
		}
	}
	return out
}
