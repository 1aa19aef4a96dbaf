// Command idemkit-churn measures how fast a consumer group recovers when its
// instances are killed. It creates a topic, produces
// a steady stream of messages with message-id headers, and runs several
// consumer.Runner instances as child processes (this same binary), each
// applying one effect per message into PostgreSQL: a row of an effects table
// stamped with clock_timestamp(). Every -kill-every it kills one instance
// (SIGKILL, or SIGTERM for a configuration marked "term") and starts it again
// at once.
//
// For each kill it reports the time to resume: from the kill until every
// partition has been assigned again and has applied a message since (the
// killed member's partitions and those of the survivors, which an eager
// rebalance stops as well). For each run it reports the longest global stall
// (no message applied anywhere) from the first kill to the end of the run,
// the share of the produced stream applied during the churn, the time from
// the last kill until the group is stable with every instance and every
// partition flows again (a rebalance storm shows here, not in the time to
// resume), the rebalances the group went through (its state polled with
// DescribeGroups) and the errors the instances' consumer groups returned
// (each one other than Rebalance In Progress makes kafka-go leave the group
// and wait JoinGroupBackoff before joining as a new member). At the end it
// stops producing, waits until every message is applied and checks that each
// message ID was applied exactly once.
//
// Configurations are given as NAME=SESSION/HEARTBEAT/REBALANCE[/term]; all
// configurations and kill intervals run in one interleaved comparison:
// rounds alternate the configurations (every other round in reverse order),
// so that a slow spell of the shared machine falls on all of them, and each
// figure is a median over rounds (per kill: over the kills of all rounds).
//
// It runs against the servers the tests use (IDEMKIT_TEST_DATABASE_URL,
// IDEMKIT_TEST_KAFKA_BROKERS) and removes its topics, groups and schemas at
// the end. Without flags it compares seven configurations (about 15
// minutes): A, a 2.5s heartbeat and a 10s rebalance timeout; B, a 30s
// rebalance timeout; C and D, a shorter session timeout; E (consumer.Config's
// defaults) and F, a rebalance timeout shorter than the session timeout; G,
// B with graceful stops (SIGTERM) for reference:
//
//	idemkit-churn -kill-every 8s,3s -churn 12s -rounds 2 \
//	  -configs A=10s/2.5s/10s,B=10s/1s/30s,C=6s/1s/30s,D=6s/1s/10s,E=10s/1s/5s,F=10s/1s/3s,G=10s/1s/30s/term
//
// A single configuration: idemkit-churn -configs X=6s/1s/5s -kill-every 8s.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// childEnv carries a childSpec (JSON) to a child process.
const childEnv = "IDEMKIT_CHURN_CHILD"

func main() {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(childMain(spec))
	}
	os.Exit(parentMain())
}

// groupConfig is one configuration of the consumer group timeouts.
type groupConfig struct {
	Name      string        `json:"name"`
	Session   time.Duration `json:"session_timeout_ns"`
	Heartbeat time.Duration `json:"heartbeat_interval_ns"`
	Rebalance time.Duration `json:"rebalance_timeout_ns"`
	// Graceful stops an instance with SIGTERM (it leaves the group) instead
	// of SIGKILL.
	Graceful bool `json:"graceful"`
}

func (g groupConfig) String() string {
	s := fmt.Sprintf("%s/%s/%s", g.Session, g.Heartbeat, g.Rebalance)
	if g.Graceful {
		s += "/term"
	}
	return s
}

// options are the command's flags.
type options struct {
	configs    []groupConfig
	killEvery  []time.Duration
	churn      time.Duration
	restart    time.Duration
	rounds     int
	rate       int
	partitions int
	instances  int
	batch      int
	stopDelay  time.Duration
	warmup     time.Duration
	settle     time.Duration
	jsonPath   string
	logDir     string
}

const configsDefault = "A=10s/2.5s/10s,B=10s/1s/30s,C=6s/1s/30s,D=6s/1s/10s,E=10s/1s/5s,F=10s/1s/3s,G=10s/1s/30s/term"

func parseFlags(args []string) (*options, error) {
	o := &options{}
	var configs, every string
	fs := flag.NewFlagSet("idemkit-churn", flag.ContinueOnError)
	fs.StringVar(&configs, "configs", configsDefault, "comma-separated configurations NAME=SESSION/HEARTBEAT/REBALANCE[/term] "+
		"(consumer.Config SessionTimeout, HeartbeatInterval, RebalanceTimeout; \"term\": stop instances with SIGTERM, not SIGKILL)")
	fs.StringVar(&every, "kill-every", "8s,3s", "comma-separated kill intervals; each is run with every configuration")
	fs.DurationVar(&o.churn, "churn", 12*time.Second, "how long instances are killed in a run (kills at 0, K, 2K, … before this)")
	fs.DurationVar(&o.restart, "restart-delay", 0, "how long a killed instance stays down before its replacement starts "+
		"(0: at once; longer than the session timeout: the survivors find the death by the session timeout)")
	fs.IntVar(&o.rounds, "rounds", 2, "rounds of the whole comparison, interleaved")
	fs.IntVar(&o.rate, "rate", 300, "messages per second produced during a run")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of each run's topic")
	fs.IntVar(&o.instances, "instances", 3, "consumer instances (child processes) in the group")
	fs.IntVar(&o.batch, "batch", 1, "consumer.Config.BatchSize of the instances")
	fs.DurationVar(&o.stopDelay, "stop-delay", 0, "when set, the handler works 10ms per message and, when a rebalance "+
		"cancels it during that time, takes this long to return (work in flight that does not honour its context)")
	fs.DurationVar(&o.warmup, "warmup", 40*time.Second, "longest wait for the group to settle before the first kill")
	fs.DurationVar(&o.settle, "settle", 45*time.Second, "longest wait, after the last kill, for every partition to resume")
	fs.StringVar(&o.jsonPath, "json", "", "also write every run's figures and timeline as JSON to this file")
	fs.StringVar(&o.logDir, "logdir", "", "keep the instances' logs (one file per run) in this directory")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: idemkit-churn [flags]\n\nNeeds %s and %s.\n\n", envDatabaseURL, envKafkaBrokers)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	var err error
	if o.configs, err = parseConfigs(configs); err != nil {
		return nil, fmt.Errorf("-configs: %w", err)
	}
	for _, s := range strings.Split(every, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("-kill-every: bad interval %q", s)
		}
		o.killEvery = append(o.killEvery, d)
	}
	switch {
	case len(o.killEvery) == 0:
		return nil, fmt.Errorf("-kill-every: none given")
	case o.churn <= 0:
		return nil, fmt.Errorf("-churn %s <= 0", o.churn)
	case o.restart < 0:
		return nil, fmt.Errorf("-restart-delay %s < 0", o.restart)
	case o.rounds < 1:
		return nil, fmt.Errorf("-rounds %d < 1", o.rounds)
	case o.rate < 1:
		return nil, fmt.Errorf("-rate %d < 1", o.rate)
	case o.partitions < 1:
		return nil, fmt.Errorf("-partitions %d < 1", o.partitions)
	case o.instances < 2:
		return nil, fmt.Errorf("-instances %d < 2: a group of one has nobody to take over", o.instances)
	case o.batch < 1:
		return nil, fmt.Errorf("-batch %d < 1", o.batch)
	case o.stopDelay < 0:
		return nil, fmt.Errorf("-stop-delay %s < 0", o.stopDelay)
	case o.warmup <= 0, o.settle <= 0:
		return nil, fmt.Errorf("-warmup and -settle must be positive")
	}
	return o, nil
}

// parseConfigs parses NAME=SESSION/HEARTBEAT/REBALANCE[/term],….
func parseConfigs(s string) ([]groupConfig, error) {
	var out []groupConfig
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		name, spec, ok := strings.Cut(item, "=")
		if !ok || name == "" || seen[name] {
			return nil, fmt.Errorf("%q: want a unique NAME=SESSION/HEARTBEAT/REBALANCE[/term]", item)
		}
		seen[name] = true
		parts := strings.Split(spec, "/")
		if len(parts) == 4 && parts[3] == "term" {
			parts = parts[:3]
		} else if len(parts) != 3 {
			return nil, fmt.Errorf("%q: want NAME=SESSION/HEARTBEAT/REBALANCE[/term]", item)
		}
		var d [3]time.Duration
		for i, p := range parts {
			v, err := time.ParseDuration(p)
			if err != nil || v <= 0 {
				return nil, fmt.Errorf("%q: bad duration %q", item, p)
			}
			d[i] = v
		}
		if d[1] >= d[0] {
			return nil, fmt.Errorf("%q: the heartbeat interval must be less than the session timeout", item)
		}
		out = append(out, groupConfig{Name: name, Session: d[0], Heartbeat: d[1], Rebalance: d[2],
			Graceful: strings.HasSuffix(spec, "/term")})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("none given")
	}
	return out, nil
}

func parentMain() int {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintln(os.Stderr, "idemkit-churn:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := runComparison(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "idemkit-churn:", err)
		return 1
	}
	return 0
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[churn %s] "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
