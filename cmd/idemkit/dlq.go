package main

import (
	"cmp"
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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
)

type dlqFlags struct {
	conn
	topic, id, at          string
	origin, errText, class string
	since, until           string
	dryRun                 bool
	rate                   float64
	replayLimit            int
	maxOutage              time.Duration
	retention              time.Duration
	applyOld               bool
	filter                 dlq.Filter
	json                   bool
	red                    redactor
	partition              int
	offset                 int64
}

const dlqListHelp = `Lists the dead letters of dead-letter topics (written by dlq.Writer; -topic a,b
lists several, e.g. every destination of a Writer with Routes, so that a message's
rounds in several of them group together), one line each, grouped per origin message: where it is (PARTITION/OFFSET), its state, message
ID, origin topic/partition/offset, replay round, error class, attempts, last failure
and last error. It only reads.
The state comes from the replay records in PostgreSQL (-database, -schema):
unresolved (no replay decided it), replayed (republished; its consumer decides),
applied (redriven, or found applied), exhausted (its replay rounds are used up),
superseded (it failed again and a later round stands for its message) or
beyond-horizon (its ID can no longer be deduplicated). An origin message has the
state of its latest round; the last line counts origin messages per state.
Without a database the states are unknown (?).
Error texts are redacted unless -show-payload: see below.
-json prints one JSON object: the dead letters shown (with their history, state and
replay record), the origin messages, the count per state and the count read.`

const dlqInspectHelp = `Shows one dead letter (or every one with the message ID): origin, consumer,
key, value, the original headers and the history of its failures. It only reads.
A value too large for the topic was kept in PostgreSQL by the writer: with
-database (or $IDEMKIT_DATABASE_URL) it is read from there and shown like any
other; without, its size is shown.
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
one whose replay rounds are used up is exhausted instead (recorded, left alone). With -retention (the
consumers' dedup retention), one older than its horizon whose message ID the dedup
store does not hold is left alone as beyond-horizon: it may have been applied and
its record purged since; -apply-beyond-horizon replays it anyway. -dry-run says what would be
done and changes nothing. The summary counts dead-letter records (a message
dead-lettered twice is two records) and then distinct origin messages.
-json prints one JSON object: each dead letter's action and both counts.
To re-run a handler in-process, use dlq.Reprocessor with Mode Redrive from Go.`

func dlqCmd(ctx context.Context, cmd *command, args []string, out io.Writer) (err error) {
	sub := cmd.sub()
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var f dlqFlags
	f.registerKafka(fs)
	if sub == "list" {
		fs.StringVar(&f.topic, "topic", "", "dead-letter topics, comma-separated (required)")
	} else {
		fs.StringVar(&f.topic, "topic", "", "dead-letter topic (required)")
	}
	fs.StringVar(&f.id, "message-id", "", "select this message ID")
	fs.StringVar(&f.id, "id", "", "same as -message-id")
	if sub == "inspect" {
		fs.StringVar(&f.at, "at", "", "the dead letter at PARTITION/OFFSET")
		f.registerDB(fs) // for values too large for the topic, kept in PostgreSQL
	} else {
		fs.StringVar(&f.origin, "origin", "", "select dead letters from this origin topic")
		fs.StringVar(&f.errText, "error", "", "select dead letters whose last error contains this text")
		fs.StringVar(&f.class, "class", "", "select dead letters whose last error class is this (permanent, transient, …)")
		fs.StringVar(&f.since, "since", "", "select dead letters that last failed at or after this time (RFC 3339)")
		fs.StringVar(&f.until, "until", "", "select dead letters that last failed before this time (RFC 3339)")
	}
	if sub == "list" {
		f.registerDB(fs)
	}
	if sub == "replay" {
		f.registerDB(fs)
		fs.BoolVar(&f.dryRun, "dry-run", false, "say what would be done, change nothing")
		fs.Float64Var(&f.rate, "rate", 0, "at most this many dead letters per second (0: no limit)")
		fs.IntVar(&f.replayLimit, "replay-limit", dlq.ReplayLimitDefault, "rounds a dead letter gets before it is exhausted (left alone)")
		fs.DurationVar(&f.maxOutage, "max-outage", 0,
			"give up when PostgreSQL or Kafka stays unreachable this long (0: wait for ever, logging the outage)")
		fs.DurationVar(&f.retention, "retention", 0,
			"the consumers' dedup retention: a dead letter past its horizon whose ID is not in the dedup store is left alone (0: not checked)")
		fs.BoolVar(&f.applyOld, "apply-beyond-horizon", false,
			"replay dead letters past the -retention horizon too (their message may have been applied before: only when applying twice is right)")
	} else {
		f.replayLimit = dlq.ReplayLimitDefault
		f.red.register(fs)
	}
	fs.BoolVar(&f.json, "json", false, "print JSON")
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
	case f.retention < 0:
		return usagef("dlq %s: -retention must be >= 0 (0: not checked), not %v", sub, f.retention)
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
	f.filter = dlq.Filter{OriginTopic: f.origin, ErrorContains: f.errText, Class: f.class}
	if f.id != "" {
		f.filter.MessageIDs = []string{f.id}
	}
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
	State     dlq.State   `json:"state,omitempty"`  // list: from the replay records
	Replay    *dlq.Replay `json:"replay,omitempty"` // list: its replay record
	Topic     string      `json:"topic"`
	Partition int         `json:"partition"`
	Offset    int64       `json:"offset"`
	MessageID string      `json:"message_id"`
	Origin    dlq.Origin  `json:"origin"`
	Group     string      `json:"group"`
	Consumer  string      `json:"consumer"`
	Round     int         `json:"round"`
	Key       *string     `json:"key,omitempty"`
	Value     *string     `json:"value,omitempty"`
	// ValueStored is the size of a value kept in PostgreSQL (see
	// dlq.HeaderValueStored), shown in Value once read from there.
	ValueStored *int          `json:"value_stored,omitempty"`
	Headers     []headerJSON  `json:"headers,omitempty"`
	History     []dlq.Failure `json:"history"`
	Redacted    bool          `json:"redacted"`
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
	if d.StoredValue != nil {
		l.ValueStored = &d.StoredValue.Size
	}
	if withPayload {
		orig := d.Original()
		l.Key, l.Value = ptr(f.red.bytes(orig.Key)), ptr(f.red.value(orig.Value))
		if d.StoredValue != nil && len(orig.Value) != d.StoredValue.Size {
			l.Value = ptr(fmt.Sprintf("(%d bytes kept in PostgreSQL: give -database to show them)", d.StoredValue.Size))
		}
		l.Headers = []headerJSON{}
		for _, h := range orig.Headers {
			l.Headers = append(l.Headers, headerJSON{h.Key, f.red.header(h.Key, h.Value)})
		}
	}
	return l
}

// listMessageJSON is an origin message as list -json prints it.
type listMessageJSON struct {
	Origin      dlq.Origin `json:"origin"`
	MessageID   string     `json:"message_id"`
	Consumer    string     `json:"consumer"`
	State       dlq.State  `json:"state"`
	DeadLetters []string   `json:"dead_letters"` // TOPIC/PARTITION/OFFSET of each, in the order read
}

// stateOrder is the order in which list and status print states.
var stateOrder = []dlq.State{dlq.StateUnresolved, dlq.StateReplayed, dlq.StateApplied, dlq.StateExhausted,
	dlq.StateSuperseded, dlq.StateBeyondHorizon}

// states says n in stateOrder ("2 unresolved, 1 applied").
func states(n map[dlq.State]int) string {
	parts := []string{}
	for _, s := range stateOrder {
		if n[s] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n[s], s))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func (f *dlqFlags) list(ctx context.Context, kc kafkaconn.Config, out io.Writer) (err error) {
	var pool *pgxpool.Pool
	if f.database != "" {
		if pool, err = connectDB(ctx, f.database); err != nil {
			return err
		}
		defer pool.Close()
	}
	topics := strings.Split(f.topic, ",")
	lcfg := &dlq.ListConfig{Kafka: kc, Topics: topics, Tables: migrate.Tables{Schema: f.schema}, Filter: f.filter, NoPayload: true}
	l, err := dlq.List(ctx, pool, lcfg)
	var unknown string // why the states are unknown
	switch {
	case pool == nil:
		unknown = "no database (-database or IDEMKIT_DATABASE_URL) to read the replay records from"
	case errors.Is(err, dlq.ErrNotMigrated):
		// The letters are still worth seeing.
		unknown = fmt.Sprintf("schema %s has no replay records table (run idemkit migrate up, or pass -schema)", f.schema)
		pool = nil
		l, err = dlq.List(ctx, nil, lcfg)
	}
	if err != nil {
		return f.dbErr(scanErr(err, f.topic))
	}
	state := func(s dlq.State) dlq.State { return cmp.Or(s, "?") }
	type unreadable struct {
		Topic     string `json:"topic"`
		Partition int    `json:"partition"`
		Offset    int64  `json:"offset"`
	}
	bad := []unreadable{}
	for _, m := range l.Unreadable {
		bad = append(bad, unreadable{m.Topic, m.Partition, m.Offset})
	}
	if f.json {
		letters, msgs := []letterJSON{}, []listMessageJSON{}
		for _, m := range l.Messages {
			mj := listMessageJSON{Origin: m.Origin, MessageID: m.MessageID, Consumer: m.Consumer, State: m.State}
			for _, x := range m.Letters {
				lj := f.letter(x.Message, x.DeadLetter, false)
				lj.State, lj.Replay = x.State, x.Replay
				letters = append(letters, lj)
				mj.DeadLetters = append(mj.DeadLetters, fmt.Sprintf("%s/%d/%d", x.Message.Topic, x.Message.Partition, x.Message.Offset))
			}
			msgs = append(msgs, mj)
		}
		var count map[dlq.State]int
		if pool != nil {
			count = l.States
		}
		return writeJSON(out, struct {
			Topics      []string          `json:"topics"`
			Read        int               `json:"read"`
			DeadLetters []letterJSON      `json:"dead_letters"`
			Messages    []listMessageJSON `json:"messages"`
			States      map[dlq.State]int `json:"states"` // origin messages per state; null without a database
			Unreadable  []unreadable      `json:"unreadable"`
		}{topics, l.Read, letters, msgs, count, bad})
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tSTATE\tMESSAGE ID\tORIGIN\tROUND\tCLASS\tATTEMPTS\tLAST FAILURE\tERROR")
	at := func(m kafka.Message) string { // the topic too when several are listed
		if len(topics) > 1 {
			return fmt.Sprintf("%s/%d/%d", m.Topic, m.Partition, m.Offset)
		}
		return fmt.Sprintf("%d/%d", m.Partition, m.Offset)
	}
	n := 0
	for _, m := range l.Messages { // grouped per origin message
		for _, x := range m.Letters {
			n++
			last := x.Last()
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%d/%d\t%d\t%s\t%d\t%s\t%s\n", at(x.Message),
				state(x.State), idOf(x.DeadLetter), x.Origin.Topic, x.Origin.Partition, x.Origin.Offset, x.Round,
				last.Class, last.Attempts, last.LastFailure.Format(time.RFC3339), short(f.red.text(last.Error), 60))
		}
	}
	for _, m := range l.Unreadable {
		fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\tnot an idemkit dead letter\n", at(m))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d dead letter(s) of %d origin message(s) shown of %d record(s) in %s\n", n, len(l.Messages), l.Read,
		strings.Join(topics, ", "))
	if unknown != "" {
		fmt.Fprintln(out, "states unknown (?): "+unknown)
	} else {
		fmt.Fprintf(out, "origin messages: %s\n", states(l.States))
	}
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
	var pool *pgxpool.Pool
	defer func() {
		if pool != nil {
			pool.Close()
		}
	}()
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
		if d.StoredValue != nil && f.database != "" {
			if pool == nil {
				if pool, err = connectDB(ctx, f.database); err != nil {
					return err
				}
			}
			if err := dlq.LoadValue(ctx, pool, migrate.Tables{Schema: f.schema}, d); err != nil {
				return f.dbErr(err)
			}
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

// horizonPolicy is the consumer.HorizonPolicy of -apply-beyond-horizon.
func horizonPolicy(apply bool) consumer.HorizonPolicy {
	if apply {
		return consumer.HorizonApply
	}
	return consumer.HorizonFail
}

// replayItemJSON is one dead letter as replay -json prints it.
type replayItemJSON struct {
	Action    dlq.Action  `json:"action"`
	Partition int         `json:"partition"`
	Offset    int64       `json:"offset"`
	MessageID *string     `json:"message_id"`
	Origin    *dlq.Origin `json:"origin"`
	Round     *int        `json:"round"`
}

// replayOrder is the order in which replay prints its counts.
var replayOrder = []dlq.Action{dlq.Republished, dlq.RepublishedNoID, dlq.WouldReplay, dlq.AlreadyApplied,
	dlq.AlreadyReplayed, dlq.Exhausted, dlq.BeyondHorizon, dlq.WriteFailed, dlq.ValueNotFound, dlq.Skipped, dlq.Unreadable}

// counts says c in replayOrder ("2 republished, 1 exhausted").
func counts(c dlq.Counts) string {
	parts := []string{}
	for _, a := range replayOrder {
		if c[a] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", c[a], a))
		}
	}
	return strings.Join(parts, ", ")
}

func (f *dlqFlags) replay(ctx context.Context, kc kafkaconn.Config, out io.Writer) (err error) {
	pool, err := connectDB(ctx, f.database)
	if err != nil {
		return err
	}
	defer pool.Close()
	defer func() { err = f.dbErr(err) }()
	items := []replayItemJSON{}
	r, err := dlq.NewReprocessor(pool, &dlq.ReprocessorConfig{
		Kafka: kc, Topic: f.topic, Mode: dlq.Republish,
		Tables: migrate.Tables{Schema: f.schema}, Filter: f.filter, DryRun: f.dryRun, Rate: f.rate,
		ReplayLimit: f.replayLimit, MaxOutage: f.maxOutage, Retention: f.retention, OnBeyondHorizon: horizonPolicy(f.applyOld),
		Progress: func(it dlq.Item) {
			if it.Action == dlq.Skipped {
				return
			}
			if f.json {
				j := replayItemJSON{Action: it.Action, Partition: it.Raw.Partition, Offset: it.Raw.Offset}
				if d := it.DeadLetter; d != nil {
					j.MessageID, j.Origin, j.Round = &d.MessageID, &d.Origin, &d.Round
				}
				items = append(items, j)
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
	if err != nil && f.json {
		return scanErr(err, f.topic)
	}
	if f.json {
		return writeJSON(out, struct {
			Topic       string           `json:"topic"`
			DryRun      bool             `json:"dry_run"`
			DeadLetters []replayItemJSON `json:"dead_letters"`
			Records     dlq.Counts       `json:"records"`
			Messages    dlq.Counts       `json:"messages"`
		}{f.topic, f.dryRun, items, sum.Records, sum.Messages})
	}
	verb := "replayed"
	if f.dryRun {
		verb = "dry run, nothing changed"
	}
	if len(sum.Records) == 0 {
		fmt.Fprintf(out, "%s: no dead letters\n", verb)
	} else {
		n := 0
		for _, c := range sum.Messages {
			n += c
		}
		fmt.Fprintf(out, "%s: %s\nper origin message (%d): %s\n", verb, counts(sum.Records), n, counts(sum.Messages))
	}
	return scanErr(err, f.topic)
}
