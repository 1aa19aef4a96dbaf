package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/migrate"
)

type dlqFlags struct {
	conn
	topic, id, at   string
	origin, errText string
	since, until    string
	dryRun          bool
	rate            float64
	replayLimit     int
	maxOutage       time.Duration
	filter          dlq.Filter
	partition       int
	offset          int64
}

func dlqCmd(ctx context.Context, sub string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("dlq "+sub, flag.ContinueOnError)
	var f dlqFlags
	f.register(fs)
	fs.StringVar(&f.topic, "topic", "", "dead-letter topic (required)")
	fs.StringVar(&f.id, "message-id", "", "select this message ID")
	fs.StringVar(&f.id, "id", "", "same as -message-id")
	fs.StringVar(&f.at, "at", "", "inspect: the dead letter at PARTITION/OFFSET")
	fs.StringVar(&f.origin, "origin", "", "select dead letters from this origin topic")
	fs.StringVar(&f.errText, "error", "", "select dead letters whose last error contains this text")
	fs.StringVar(&f.since, "since", "", "select dead letters that last failed at or after this time (RFC 3339)")
	fs.StringVar(&f.until, "until", "", "select dead letters that last failed before this time (RFC 3339)")
	fs.BoolVar(&f.dryRun, "dry-run", false, "replay: say what would be done, change nothing")
	fs.Float64Var(&f.rate, "rate", 0, "replay: at most this many dead letters per second (0: no limit)")
	fs.IntVar(&f.replayLimit, "replay-limit", dlq.ReplayLimitDefault, "replay: rounds a dead letter gets before it is parked")
	fs.DurationVar(&f.maxOutage, "max-outage", 0,
		"replay: give up when PostgreSQL or Kafka stays unreachable this long (0: wait for ever, logging the outage)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("dlq %s takes no arguments, got %q", sub, pos)
	}
	if f.topic == "" {
		return usagef("dlq %s needs -topic", sub)
	}
	switch {
	case f.rate < 0 || math.IsNaN(f.rate) || math.IsInf(f.rate, 0):
		return usagef("dlq %s: -rate must be a number >= 0 (0: no limit), not %v", sub, f.rate)
	case f.replayLimit < 1:
		return usagef("dlq %s: -replay-limit must be at least 1, not %d", sub, f.replayLimit)
	case f.maxOutage < 0:
		return usagef("dlq %s: -max-outage must be >= 0 (0: wait for ever), not %v", sub, f.maxOutage)
	}
	if err := f.parseFilter(); err != nil {
		return err
	}
	brokers, err := f.brokerList()
	if err != nil {
		return err
	}
	if err := reachKafka(ctx, brokers); err != nil {
		return err
	}
	switch sub {
	case "list":
		return f.list(ctx, brokers, out)
	case "inspect":
		return f.inspect(ctx, brokers, out)
	default:
		return f.replay(ctx, brokers, out)
	}
}

func (f *dlqFlags) parseFilter() error {
	f.filter = dlq.Filter{MessageID: f.id, OriginTopic: f.origin, ErrorContains: f.errText}
	for _, t := range []struct {
		name, v string
		dst     *time.Time
	}{{"since", f.since, &f.filter.Since}, {"until", f.until, &f.filter.Until}} {
		if t.v == "" {
			continue
		}
		v, err := time.Parse(time.RFC3339, t.v)
		if err != nil {
			return usagef("-%s: %q is not an RFC 3339 time (e.g. 2026-11-30T08:00:00Z)", t.name, t.v)
		}
		*t.dst = v
	}
	if f.at != "" {
		p, o, ok := strings.Cut(f.at, "/")
		var err1, err2 error
		f.partition, err1 = strconv.Atoi(p)
		f.offset, err2 = strconv.ParseInt(o, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return usagef("-at: want PARTITION/OFFSET, e.g. 0/42, not %q", f.at)
		}
	}
	return nil
}

func reachKafka(ctx context.Context, brokers []string) error {
	cctx, cancel := context.WithTimeout(ctx, dial)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: dial}
	if _, err := client.Metadata(cctx, &kafka.MetadataRequest{Topics: []string{}}); err != nil {
		return fmt.Errorf("Kafka at %s does not answer: %w", strings.Join(brokers, ","), err)
	}
	return nil
}

func scanErr(err error, topic string) error {
	if errors.Is(err, dlq.ErrNoTopic) {
		return fmt.Errorf("topic %s does not exist", topic)
	}
	return err
}

func (f *dlqFlags) list(ctx context.Context, brokers []string, out io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tMESSAGE ID\tORIGIN\tROUND\tCLASS\tATTEMPTS\tLAST FAILURE\tERROR")
	n, shown := 0, 0
	err := dlq.Scan(ctx, brokers, f.topic, func(m kafka.Message) error {
		n++
		d, err := dlq.Parse(m)
		if err != nil {
			fmt.Fprintf(tw, "%d/%d\t-\t-\t-\t-\t-\t-\tnot an idemkit dead letter\n", m.Partition, m.Offset)
			return nil
		}
		if !f.filter.Match(d) {
			return nil
		}
		shown++
		last := d.Last()
		fmt.Fprintf(tw, "%d/%d\t%s\t%s/%d/%d\t%d\t%s\t%d\t%s\t%s\n", m.Partition, m.Offset, idOf(d),
			d.Origin.Topic, d.Origin.Partition, d.Origin.Offset, d.Round, last.Class, last.Attempts,
			last.LastFailure.Format(time.RFC3339), short(last.Error, 60))
		return nil
	})
	if err != nil {
		return scanErr(err, f.topic)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d dead letter(s) shown of %d in %s\n", shown, n, f.topic)
	return nil
}

// idOf shows a dead letter's message ID, or that it has none.
func idOf(d *dlq.DeadLetter) string {
	if d.MessageID == "" {
		return "(no id)"
	}
	return d.MessageID
}

func short(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

func (f *dlqFlags) inspect(ctx context.Context, brokers []string, out io.Writer) error {
	if (f.id == "") == (f.at == "") {
		return usagef("dlq inspect needs -id ID or -at PARTITION/OFFSET (one of them)")
	}
	found := 0
	err := dlq.Scan(ctx, brokers, f.topic, func(m kafka.Message) error {
		if f.at != "" && (m.Partition != f.partition || m.Offset != f.offset) {
			return nil
		}
		d, err := dlq.Parse(m)
		if err != nil {
			if f.at != "" {
				return err
			}
			return nil
		}
		if f.id != "" && d.MessageID != f.id {
			return nil
		}
		found++
		fmt.Fprintf(out, "dead letter %s/%d/%d\n", m.Topic, m.Partition, m.Offset)
		fmt.Fprintf(out, "  message id  %s\n  origin      %s partition %d offset %d incarnation %d\n  consumer    %s (group %s)\n  round       %d\n",
			idOf(d), d.Origin.Topic, d.Origin.Partition, d.Origin.Offset, d.Origin.Incarnation, d.Consumer, d.Group, d.Round)
		fmt.Fprintf(out, "  key         %q\n  value       %s\n", m.Key, short(string(m.Value), 200))
		for _, h := range d.Original().Headers {
			fmt.Fprintf(out, "  header      %s: %s\n", h.Key, short(string(h.Value), 120))
		}
		for _, h := range d.History {
			fmt.Fprintf(out, "  round %d     %s, %d attempt(s) %s .. %s: %s\n", h.Round, h.Class, h.Attempts,
				h.FirstFailure.Format(time.RFC3339), h.LastFailure.Format(time.RFC3339), h.Error)
		}
		return nil
	})
	if err != nil {
		return scanErr(err, f.topic)
	}
	if found == 0 {
		return fmt.Errorf("no dead letter %s%s in %s", f.id, f.at, f.topic)
	}
	return nil
}

func (f *dlqFlags) replay(ctx context.Context, brokers []string, out io.Writer) error {
	pool, err := connectDB(ctx, f.database)
	if err != nil {
		return err
	}
	defer pool.Close()
	r, err := dlq.NewReprocessor(&dlq.ReprocessorConfig{
		Brokers: brokers, Topic: f.topic, Mode: dlq.Republish, Pool: pool,
		Tables: migrate.Config{Schema: f.schema}, Filter: f.filter, DryRun: f.dryRun, Rate: f.rate,
		ReplayLimit: f.replayLimit, MaxOutage: f.maxOutage,
		Progress: func(it dlq.Item) {
			if it.Action == dlq.Skipped {
				return
			}
			id, origin := "-", "-"
			if d := it.DeadLetter; d != nil {
				id, origin = idOf(d), fmt.Sprintf("%s/%d/%d", d.Origin.Topic, d.Origin.Partition, d.Origin.Offset)
			}
			fmt.Fprintf(out, "%-17s %d/%d  %s  from %s\n", it.Action, it.Raw.Partition, it.Raw.Offset, id, origin)
		},
	})
	if err != nil {
		return err
	}
	defer r.Close()
	sum, err := r.Run(ctx)
	parts := []string{}
	for _, a := range []dlq.Action{dlq.Republished, dlq.RepublishedNoID, dlq.WouldReplay, dlq.AlreadyApplied,
		dlq.AlreadyReplayed, dlq.Parked, dlq.Skipped, dlq.Unreadable} {
		if sum[a] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", sum[a], a))
		}
	}
	verb := "replayed"
	if f.dryRun {
		verb = "dry run, nothing changed"
	}
	if len(parts) == 0 {
		parts = []string{"no dead letters"}
	}
	fmt.Fprintf(out, "%s: %s\n", verb, strings.Join(parts, ", "))
	return scanErr(err, f.topic)
}
