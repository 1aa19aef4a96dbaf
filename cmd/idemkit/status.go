package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/kafkaoffsets"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/monitor"
)

const statusHelp = `One screen on everything idemkit keeps: per consumer and topic, the
partitions, the lag (stable log end minus the PostgreSQL position), the
parked messages and the oldest; per dead-letter topic, its records (from
its offsets) and its origin messages per state (it reads the topic and
the replay records: see idemkit dlq list -h), the unresolved ones checked
against -max-dlq; the outbox backlog, its oldest message and
the dead ones; the HTTP idempotency records stuck in flight; the age of
the oldest processed-message record per consumer (against -retention).
A table that does not exist is reported as such (not an error).

Exit status: 0 healthy, 1 failed, 2 bad usage, 3 a threshold was crossed
(each is printed): use it as a cron or probe check. A negative threshold
is not checked.`

// Status exit code when a threshold is crossed.
const exitThreshold = 3

// thresholdError makes main exit 3 after the report was printed.
type thresholdError struct{ crossed []string }

func (e *thresholdError) Error() string {
	return fmt.Sprintf("%d threshold(s) crossed: %s", len(e.crossed), strings.Join(e.crossed, "; "))
}

type statusFlags struct {
	conn
	json         bool
	dlqSuffix    string
	outboxTable  string
	recordsTable string
	maxLag       int64
	maxParkedAge time.Duration
	maxOutboxAge time.Duration
	maxStuck     int
	maxDLQ       int64
	dlqTopics    string
	retention    time.Duration
	noPositions  bool // the positions table is missing
}

// statusReport is what `idemkit status -json` prints.
type statusReport struct {
	Time        time.Time         `json:"time"`
	Consumers   []consumerStatus  `json:"consumers"`
	DeadLetters []deadLetterTopic `json:"dead_letter_topics"`
	Outbox      *outboxStatus     `json:"outbox"`
	Idempotency *recordsStatus    `json:"idempotency"`
	Notes       []string          `json:"notes"`
	Crossed     []string          `json:"thresholds_crossed"`
}

type consumerStatus struct {
	Consumer               string            `json:"consumer"`
	Topic                  string            `json:"topic"`
	Partitions             []partitionStatus `json:"partitions"`
	Lag                    int64             `json:"lag"`
	Parked                 int64             `json:"parked"`
	OldestParkedAgeSeconds *float64          `json:"oldest_parked_age_seconds"`
	OldestRecordAgeSeconds *float64          `json:"oldest_record_age_seconds"`
}

type partitionStatus struct {
	Partition int    `json:"partition"`
	Position  int64  `json:"position"`
	StableEnd *int64 `json:"stable_end"`
	Lag       *int64 `json:"lag"`
	Note      string `json:"note,omitempty"`
}

type deadLetterTopic struct {
	Topic string `json:"topic"`
	// Messages counts the records (the depth, from the offsets).
	Messages int64 `json:"messages"`
	// Unresolved counts the origin messages no replay decided.
	Unresolved int `json:"unresolved"`
	// States counts the origin messages per state.
	States map[dlq.State]int `json:"states"`
	// Unreadable counts the records that are not idemkit dead letters.
	Unreadable int `json:"unreadable"`
}

type outboxStatus struct {
	Table            string  `json:"table"`
	Backlog          int64   `json:"backlog"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Dead             int64   `json:"dead"`
	Held             int64   `json:"held"`
}

type recordsStatus struct {
	Table string `json:"table"`
	Stuck int64  `json:"stuck"`
}

func statusCmd(ctx context.Context, cmd *command, args []string, out io.Writer) error {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var f statusFlags
	f.register(fs)
	fs.BoolVar(&f.json, "json", false, "print JSON")
	fs.StringVar(&f.dlqSuffix, "dlq-suffix", dlq.TopicSuffixDefault, "dead-letter topics are the topics whose name ends with this")
	fs.StringVar(&f.dlqTopics, "dlq-topics", "", "more dead-letter topics, comma-separated (the destinations of dlq.WriterConfig.Routes)")
	fs.StringVar(&f.outboxTable, "outbox-table", migrate.OutboxDefault, "outbox table")
	fs.StringVar(&f.recordsTable, "records-table", migrate.IdempotencyRecordsDefault, "HTTP idempotency records table")
	fs.Int64Var(&f.maxLag, "max-lag", 10000, "threshold: most lag of a consumer on a topic")
	fs.DurationVar(&f.maxParkedAge, "max-parked-age", time.Hour, "threshold: oldest parked consumer message")
	fs.DurationVar(&f.maxOutboxAge, "max-outbox-age", 5*time.Minute, "threshold: oldest unpublished outbox message")
	fs.IntVar(&f.maxStuck, "max-stuck", 0, "threshold: most idempotency records stuck in flight")
	fs.Int64Var(&f.maxDLQ, "max-dlq", -1, "threshold: most unresolved origin messages in a dead-letter topic")
	fs.DurationVar(&f.retention, "retention", 0, "the consumers' dedup retention: records older than 1.25× it cross a threshold (0: not checked)")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("status takes no arguments, got %q", pos)
	}
	if f.retention < 0 {
		return usagef("status: -retention must not be negative")
	}
	kc, client, closeKafka, err := f.dialKafka(ctx)
	if err != nil {
		return err
	}
	defer closeKafka()
	pool, err := connectDB(ctx, f.database)
	if err != nil {
		return err
	}
	defer pool.Close()

	rep := &statusReport{Time: time.Now().UTC(), Consumers: []consumerStatus{}, DeadLetters: []deadLetterTopic{},
		Notes: []string{}, Crossed: []string{}}
	if err := f.collect(ctx, kc, pool, rep); err != nil {
		return err
	}
	if err := f.deadLetters(ctx, kc, pool, client, rep); err != nil {
		return err
	}
	if rep.Outbox == nil && rep.Idempotency == nil && len(rep.Consumers) == 0 && f.noPositions {
		return fmt.Errorf("schema %s has none of idemkit's tables: a wrong -schema? (run idemkit migrate up to create them)", f.schema)
	}
	f.check(rep)
	if f.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else if err := printStatus(out, rep); err != nil {
		return err
	}
	if len(rep.Crossed) > 0 {
		return &thresholdError{crossed: rep.Crossed}
	}
	return nil
}

// missingTable reports whether err is PostgreSQL's undefined_table.
func missingTable(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "42P01"
}

func (f *statusFlags) table(name string) string { return pgx.Identifier{f.schema, name}.Sanitize() }

// collect reads the consumers, the outbox and the idempotency records
// with package monitor.
func (f *statusFlags) collect(ctx context.Context, kc kafkaconn.Config, pool *pgxpool.Pool, rep *statusReport) error {
	m, err := monitor.New(&monitor.Config{Kafka: kc,
		Tables: migrate.Tables{Schema: f.schema, Outbox: f.outboxTable, IdempotencyRecords: f.recordsTable}, OldestRecordTimeout: oldestRecordTimeout})
	if err != nil {
		return usagef("%v", err)
	}
	defer m.Close()
	snap, err := m.Collect(ctx, pool)
	if err != nil {
		return err
	}
	tables := m.Tables()
	for _, c := range snap.Consumers {
		cs := consumerStatus{Consumer: c.Name, Topic: c.Topic, Partitions: []partitionStatus{}, Lag: c.Lag, Parked: c.Parked,
			OldestParkedAgeSeconds: seconds(c.OldestParkedAge), OldestRecordAgeSeconds: seconds(c.OldestRecordAge)}
		for _, p := range c.Partitions {
			cs.Partitions = append(cs.Partitions, partitionStatus{Partition: p.Partition, Position: p.Position,
				StableEnd: p.StableEnd, Lag: p.Lag, Note: p.Note})
		}
		rep.Consumers = append(rep.Consumers, cs)
	}
	if o := snap.Outbox; o != nil {
		rep.Outbox = &outboxStatus{Table: o.Table, Backlog: o.Backlog, OldestAgeSeconds: o.OldestAge.Seconds(),
			Dead: o.Dead, Held: o.Held}
	}
	if r := snap.Idempotency; r != nil {
		rep.Idempotency = &recordsStatus{Table: r.Table, Stuck: r.Stuck}
	}
	for _, t := range snap.Missing {
		switch t {
		case tables.ConsumerPositions:
			rep.Notes = append(rep.Notes, "no consumer positions table: run idemkit migrate up")
			f.noPositions = true
		case tables.Outbox:
			rep.Notes = append(rep.Notes, "no outbox table "+t)
		case tables.IdempotencyRecords:
			rep.Notes = append(rep.Notes, "no idempotency records table "+t)
		}
	}
	rep.Notes = append(rep.Notes, snap.Notes...)
	return nil
}

// seconds returns d in seconds, nil for nil.
func seconds(d *time.Duration) *float64 {
	if d == nil {
		return nil
	}
	s := d.Seconds()
	return &s
}

// deadLetters sums the messages of each dead-letter topic (those named
// with the suffix, and -dlq-topics) from its log range, and reads them all
// to count their origin messages per state.
func (f *statusFlags) deadLetters(ctx context.Context, kc kafkaconn.Config, pool *pgxpool.Pool, client *kafka.Client,
	rep *statusReport) error {
	if f.dlqSuffix == "" && f.dlqTopics == "" {
		return nil
	}
	md, err := client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return fmt.Errorf("list topics: %w", err)
	}
	named := []string{}
	if f.dlqTopics != "" {
		named = strings.Split(f.dlqTopics, ",")
	}
	var topics []string
	for _, t := range md.Topics {
		if t.Error != nil || !(f.dlqSuffix != "" && strings.HasSuffix(t.Name, f.dlqSuffix) || slices.Contains(named, t.Name)) {
			continue
		}
		parts := make([]int, len(t.Partitions))
		for i, p := range t.Partitions {
			parts[i] = p.ID
		}
		ranges, err := kafkaoffsets.LogRange(ctx, client, t.Name, parts...)
		if err != nil {
			return fmt.Errorf("log range of %s: %w", t.Name, err)
		}
		var n int64
		for _, r := range ranges {
			n += r.End - r.Start
		}
		rep.DeadLetters = append(rep.DeadLetters, deadLetterTopic{Topic: t.Name, Messages: n})
		topics = append(topics, t.Name)
	}
	for _, name := range named {
		if !slices.Contains(topics, name) {
			rep.Notes = append(rep.Notes, "dead-letter topic "+name+" (-dlq-topics) does not exist")
		}
	}
	slices.SortFunc(rep.DeadLetters, func(a, b deadLetterTopic) int { return strings.Compare(a.Topic, b.Topic) })
	if len(topics) == 0 {
		return nil
	}
	// One listing of them all: a message whose rounds went to several
	// topics (routes) counts once, in the topic of its latest round.
	lcfg := &dlq.ListConfig{Kafka: kc, Topics: topics, Tables: migrate.Tables{Schema: f.schema}, NoPayload: true,
		DropHeaders: true, Window: &dlq.Window{}} // counts only
	l, err := dlq.List(ctx, pool, lcfg)
	noReplays := errors.Is(err, dlq.ErrNotMigrated)
	if noReplays {
		// Without the table no replay ever ran in this schema: every
		// message is unresolved.
		rep.Notes = append(rep.Notes, noReplaysNote)
		l, err = dlq.List(ctx, nil, lcfg)
	}
	if err != nil {
		return fmt.Errorf("read dead-letter topics: %w", err)
	}
	if noReplays {
		for _, c := range l.ByTopic {
			c.States[dlq.StateUnresolved] += c.States[""]
			delete(c.States, "")
		}
	}
	for i := range rep.DeadLetters {
		d := &rep.DeadLetters[i]
		d.States = l.ByTopic[d.Topic].States
		d.Unresolved = d.States[dlq.StateUnresolved]
		for _, m := range l.Unreadable {
			if m.Topic == d.Topic {
				d.Unreadable++
			}
		}
	}
	return nil
}

// noReplaysNote says why dead letters have no state.
const noReplaysNote = "no dead-letter replay records table: every dead-lettered message counted as unresolved (run idemkit migrate up)"

// oldestRecordTimeout bounds the search for a consumer's oldest record.
const oldestRecordTimeout = 5 * time.Second

// check compares the report with the thresholds.
func (f *statusFlags) check(rep *statusReport) {
	cross := func(format string, args ...any) { rep.Crossed = append(rep.Crossed, fmt.Sprintf(format, args...)) }
	for _, c := range rep.Consumers {
		if f.maxLag >= 0 && c.Lag > f.maxLag {
			cross("consumer %s on %s: lag %d > %d", c.Consumer, c.Topic, c.Lag, f.maxLag)
		}
		if age := c.OldestParkedAgeSeconds; f.maxParkedAge >= 0 && age != nil && *age > f.maxParkedAge.Seconds() {
			cross("consumer %s on %s: a message parked for %s > %s", c.Consumer, c.Topic, secs(*age), f.maxParkedAge)
		}
		if age := c.OldestRecordAgeSeconds; f.retention > 0 && age != nil && *age > 1.25*f.retention.Seconds() {
			cross("consumer %s: oldest processed record %s old > 1.25 × retention %s (purge behind)", c.Consumer, secs(*age), f.retention)
		}
	}
	for _, d := range rep.DeadLetters {
		if f.maxDLQ >= 0 && int64(d.Unresolved) > f.maxDLQ {
			cross("dead-letter topic %s: %d unresolved origin messages > %d", d.Topic, d.Unresolved, f.maxDLQ)
		}
	}
	if o := rep.Outbox; o != nil && f.maxOutboxAge >= 0 && o.Backlog > 0 && o.OldestAgeSeconds > f.maxOutboxAge.Seconds() {
		cross("outbox %s: oldest unpublished message %s old > %s", o.Table, secs(o.OldestAgeSeconds), f.maxOutboxAge)
	}
	if r := rep.Idempotency; r != nil && f.maxStuck >= 0 && r.Stuck > int64(f.maxStuck) {
		cross("idempotency records %s: %d stuck in flight > %d", r.Table, r.Stuck, f.maxStuck)
	}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)).Round(time.Second) }

func printStatus(out io.Writer, rep *statusReport) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "idemkit status at %s\n\n", rep.Time.Format(time.RFC3339))
	fmt.Fprintln(w, "CONSUMER\tTOPIC\tPARTITIONS\tLAG\tPARKED\tOLDEST PARKED\tOLDEST RECORD")
	for _, c := range rep.Consumers {
		parked, record := "-", "-"
		if c.OldestParkedAgeSeconds != nil {
			parked = secs(*c.OldestParkedAgeSeconds).String()
		}
		if c.OldestRecordAgeSeconds != nil {
			record = secs(*c.OldestRecordAgeSeconds).String()
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", c.Consumer, c.Topic, len(c.Partitions), c.Lag, c.Parked, parked, record)
		for _, p := range c.Partitions {
			if p.Note != "" {
				fmt.Fprintf(w, "\t  partition %d\tposition %d: %s\t\t\t\t\n", p.Partition, p.Position, p.Note)
			}
		}
	}
	if len(rep.Consumers) == 0 {
		fmt.Fprintln(w, "(no consumer has a position yet)")
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "DEAD-LETTER TOPIC\tRECORDS\tUNRESOLVED\tORIGIN MESSAGES")
	for _, d := range rep.DeadLetters {
		st := states(d.States)
		if d.Unreadable > 0 {
			st += fmt.Sprintf("; %d unreadable record(s)", d.Unreadable)
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", d.Topic, d.Messages, d.Unresolved, st)
	}
	if len(rep.DeadLetters) == 0 {
		fmt.Fprintln(w, "(none)")
	}
	fmt.Fprintln(w)
	if o := rep.Outbox; o != nil {
		fmt.Fprintf(w, "outbox %s: backlog %d, oldest %s, dead %d (%d of them held behind an earlier message of their key)\n",
			o.Table, o.Backlog, secs(o.OldestAgeSeconds), o.Dead, o.Held)
	}
	if r := rep.Idempotency; r != nil {
		fmt.Fprintf(w, "idempotency records %s: %d stuck in flight\n", r.Table, r.Stuck)
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if len(rep.Crossed) > 0 {
		fmt.Fprintln(w)
		for _, c := range rep.Crossed {
			fmt.Fprintf(w, "THRESHOLD CROSSED: %s\n", c)
		}
	}
	return w.Flush()
}
