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
	"github.com/idemkit/idemkit/kafkaconn"
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
	json            bool
	red             redactor
	partition       int
	offset          int64
}

const dlqListHelp = `Lists the dead letters of a dead-letter topic (written by dlq.Writer), one line
each: where it is (PARTITION/OFFSET), message ID, origin topic/partition/offset,
replay round, error class, attempts, last failure and last error. It only reads.
Error texts are redacted unless -show-payload: see below.
-json prints one JSON object: the dead letters shown (with their history) and the
count read.`

const dlqInspectHelp = `Shows one dead letter (or every one with the message ID): origin, consumer,
key, value, the original headers and the history of its failures. It only reads.
Payloads, headers and error texts are redacted by default, in every output,
-json too: card numbers (runs of 13 to 19 digits, also grouped by separators or
%20, and Luhn-valid ones inside longer runs) keep only their last four digits;
JSON values (also one per line, or JSON inside a string) keep their shape with
sensitive members masked whole: names containing password, secret, token, ...,
ending in key, or listed with -redact-fields; the same names are masked in form
bodies, XML, JSON cut short, headers and name=value pairs of error texts; JWTs,
API key shapes and Authorization credentials are masked wherever they are;
-redact-regexp matches are masked; values that are not UTF-8 show their size.
-show-payload shows everything verbatim (not UTF-8: base64). Control characters
are always shown escaped (\u001b), so that no output can drive the terminal.
-json prints a JSON array of the dead letters found.`

const dlqReplayHelp = `Writes each selected dead letter back to its origin topic (the consumer's dedup
makes repeats harmless; one without message ID goes back too, and the consumer
applies its MissingID policy again) and records who replayed what in PostgreSQL;
one whose replay rounds are used up is parked instead. -dry-run says what would be
done and changes nothing. To re-run a handler in-process, use dlq.Reprocessor with
Mode Redrive from Go.`

func dlqCmd(ctx context.Context, cmd *command, args []string, out io.Writer) (err error) {
	sub := cmd.sub()
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var f dlqFlags
	f.registerKafka(fs)
	fs.StringVar(&f.topic, "topic", "", "dead-letter topic (required)")
	fs.StringVar(&f.id, "message-id", "", "select this message ID")
	fs.StringVar(&f.id, "id", "", "same as -message-id")
	if sub == "inspect" {
		fs.StringVar(&f.at, "at", "", "the dead letter at PARTITION/OFFSET")
	} else {
		fs.StringVar(&f.origin, "origin", "", "select dead letters from this origin topic")
		fs.StringVar(&f.errText, "error", "", "select dead letters whose last error contains this text")
		fs.StringVar(&f.since, "since", "", "select dead letters that last failed at or after this time (RFC 3339)")
		fs.StringVar(&f.until, "until", "", "select dead letters that last failed before this time (RFC 3339)")
	}
	if sub == "replay" {
		f.registerDB(fs)
		fs.BoolVar(&f.dryRun, "dry-run", false, "say what would be done, change nothing")
		fs.Float64Var(&f.rate, "rate", 0, "at most this many dead letters per second (0: no limit)")
		fs.IntVar(&f.replayLimit, "replay-limit", dlq.ReplayLimitDefault, "rounds a dead letter gets before it is parked")
		fs.DurationVar(&f.maxOutage, "max-outage", 0,
			"give up when PostgreSQL or Kafka stays unreachable this long (0: wait for ever, logging the outage)")
	} else {
		f.replayLimit = dlq.ReplayLimitDefault
		fs.BoolVar(&f.json, "json", false, "print JSON")
		f.red.register(fs)
	}
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
	if err := f.red.init(fs); err != nil {
		return err
	}
	kc, _, closeKafka, err := f.dialKafka(ctx)
	if err != nil {
		return err
	}
	closeKafka() // reached; the dlq package connects on its own
	switch sub {
	case "list":
		return f.list(ctx, kc, out)
	case "inspect":
		return f.inspect(ctx, kc, out)
	default:
		return f.replay(ctx, kc, out)
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

func scanErr(err error, topic string) error {
	if errors.Is(err, dlq.ErrNoTopic) {
		return fmt.Errorf("topic %s does not exist", topic)
	}
	return err
}

// letterJSON is a dead letter as -json prints it; key, value and header
// values are redacted unless -show-payload.
type letterJSON struct {
	Topic     string        `json:"topic"`
	Partition int           `json:"partition"`
	Offset    int64         `json:"offset"`
	MessageID string        `json:"message_id"`
	Origin    dlq.Origin    `json:"origin"`
	Group     string        `json:"group"`
	Consumer  string        `json:"consumer"`
	Round     int           `json:"round"`
	Key       *string       `json:"key,omitempty"`
	Value     *string       `json:"value,omitempty"`
	Headers   []headerJSON  `json:"headers,omitempty"`
	History   []dlq.Failure `json:"history"`
	Redacted  bool          `json:"redacted"`
}

type headerJSON struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// letter is d as JSON, with its payload when withPayload.
func (f *dlqFlags) letter(m kafka.Message, d *dlq.DeadLetter, withPayload bool) letterJSON {
	l := letterJSON{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, MessageID: d.MessageID, Origin: d.Origin,
		Group: d.Group, Consumer: d.Consumer, Round: d.Round, History: make([]dlq.Failure, len(d.History)), Redacted: !f.red.show}
	for i, h := range d.History {
		h.Error = f.red.text(h.Error)
		l.History[i] = h
	}
	if withPayload {
		orig := d.Original()
		l.Key, l.Value = ptr(f.red.bytes(orig.Key)), ptr(f.red.value(orig.Value))
		l.Headers = []headerJSON{}
		for _, h := range orig.Headers {
			l.Headers = append(l.Headers, headerJSON{h.Key, f.red.header(h.Key, h.Value)})
		}
	}
	return l
}

func (f *dlqFlags) list(ctx context.Context, kc kafkaconn.Config, out io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	if !f.json {
		fmt.Fprintln(tw, "AT\tMESSAGE ID\tORIGIN\tROUND\tCLASS\tATTEMPTS\tLAST FAILURE\tERROR")
	}
	n := 0
	letters := []letterJSON{}
	type unreadable struct {
		Partition int   `json:"partition"`
		Offset    int64 `json:"offset"`
	}
	bad := []unreadable{}
	err := dlq.Scan(ctx, kc, f.topic, func(m kafka.Message) error {
		n++
		d, err := dlq.Parse(m)
		if err != nil {
			bad = append(bad, unreadable{m.Partition, m.Offset})
			if !f.json {
				fmt.Fprintf(tw, "%d/%d\t-\t-\t-\t-\t-\t-\tnot an idemkit dead letter\n", m.Partition, m.Offset)
			}
			return nil
		}
		if !f.filter.Match(d) {
			return nil
		}
		letters = append(letters, f.letter(m, d, false))
		if f.json {
			return nil
		}
		last := d.Last()
		fmt.Fprintf(tw, "%d/%d\t%s\t%s/%d/%d\t%d\t%s\t%d\t%s\t%s\n", m.Partition, m.Offset, idOf(d),
			d.Origin.Topic, d.Origin.Partition, d.Origin.Offset, d.Round, last.Class, last.Attempts,
			last.LastFailure.Format(time.RFC3339), short(f.red.text(last.Error), 60))
		return nil
	})
	if err != nil {
		return scanErr(err, f.topic)
	}
	if f.json {
		return writeJSON(out, struct {
			Topic       string       `json:"topic"`
			Read        int          `json:"read"`
			DeadLetters []letterJSON `json:"dead_letters"`
			Unreadable  []unreadable `json:"unreadable"`
		}{f.topic, n, letters, bad})
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d dead letter(s) shown of %d in %s\n", len(letters), n, f.topic)
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

func (f *dlqFlags) inspect(ctx context.Context, kc kafkaconn.Config, out io.Writer) error {
	if (f.id == "") == (f.at == "") {
		return usagef("dlq inspect needs -id ID or -at PARTITION/OFFSET (one of them)")
	}
	found := []letterJSON{}
	err := dlq.Scan(ctx, kc, f.topic, func(m kafka.Message) error {
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
		l := f.letter(m, d, true)
		found = append(found, l)
		if f.json {
			return nil
		}
		fmt.Fprintf(out, "dead letter %s/%d/%d\n", m.Topic, m.Partition, m.Offset)
		fmt.Fprintf(out, "  message id  %s\n  origin      %s partition %d offset %d incarnation %d\n  consumer    %s (group %s)\n  round       %d\n",
			idOf(d), d.Origin.Topic, d.Origin.Partition, d.Origin.Offset, d.Origin.Incarnation, d.Consumer, d.Group, d.Round)
		fmt.Fprintf(out, "  key         %q\n  value       %s\n", *l.Key, short(*l.Value, 200))
		for _, h := range l.Headers {
			fmt.Fprintf(out, "  header      %s: %s\n", h.Key, short(h.Value, 120))
		}
		for _, h := range l.History {
			fmt.Fprintf(out, "  round %d     %s, %d attempt(s) %s .. %s: %s\n", h.Round, h.Class, h.Attempts,
				h.FirstFailure.Format(time.RFC3339), h.LastFailure.Format(time.RFC3339), h.Error)
		}
		if l.Redacted {
			fmt.Fprintln(out, "  (redacted: -show-payload shows key, value, headers and errors verbatim)")
		}
		return nil
	})
	if err != nil {
		return scanErr(err, f.topic)
	}
	if len(found) == 0 {
		return fmt.Errorf("no dead letter %s%s in %s", f.id, f.at, f.topic)
	}
	if f.json {
		return writeJSON(out, found)
	}
	return nil
}

func (f *dlqFlags) replay(ctx context.Context, kc kafkaconn.Config, out io.Writer) (err error) {
	pool, err := connectDB(ctx, f.database)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer func() { err = f.dbErr(err) }()
	r, err := dlq.NewReprocessor(pool, &dlq.ReprocessorConfig{
		Kafka: kc, Topic: f.topic, Mode: dlq.Republish,
		Schema: f.schema, Filter: f.filter, DryRun: f.dryRun, Rate: f.rate,
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
