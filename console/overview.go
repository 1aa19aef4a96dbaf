package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/internal/kafkaoffsets"
)

// overviewData is the overview: what idemkit status prints.
type overviewData struct {
	Time        time.Time         `json:"time"`
	Consumers   []consumerSummary `json:"consumers"`
	DeadLetters []deadLetterTopic `json:"dead_letter_topics"`
	Outbox      *outboxSummary    `json:"outbox"`
	Idempotency *stuckSummary     `json:"idempotency"`
	Dedup       dedupSummary      `json:"dedup"`
	Notes       []string          `json:"notes"`
	// Crossed says each threshold crossed, as idemkit status does (it
	// exits 3 then).
	Crossed []string `json:"thresholds_crossed"`
}

type consumerSummary struct {
	Consumer               string             `json:"consumer"`
	Topic                  string             `json:"topic"`
	Partitions             []partitionSummary `json:"partitions"`
	Lag                    int64              `json:"lag"`
	Parked                 int64              `json:"parked"`
	OldestParkedAgeSeconds *float64           `json:"oldest_parked_age_seconds"`
	OldestRecordAgeSeconds *float64           `json:"oldest_record_age_seconds"`
	// Held counts the partitions whose stable end is before their log end
	// is not known here; Notes name the partitions that are odd.
	Crossed bool `json:"crossed"`
}

type partitionSummary struct {
	Partition int    `json:"partition"`
	Position  int64  `json:"position"`
	StableEnd *int64 `json:"stable_end"`
	Lag       *int64 `json:"lag"`
	Note      string `json:"note,omitempty"`
}

type deadLetterTopic struct {
	Topic string `json:"topic"`
	// Records counts the records (the depth, from the offsets).
	Records int64 `json:"records"`
	// Unresolved counts the origin messages no replay decided.
	Unresolved int `json:"unresolved"`
	// States counts the origin messages per state.
	States map[dlq.State]int `json:"states"`
	// Unreadable counts the records that are not idemkit dead letters.
	Unreadable int `json:"unreadable"`
	// Oldest and Newest are the last failures of its oldest and newest
	// letters; nil when it has none.
	Oldest  *time.Time `json:"oldest"`
	Newest  *time.Time `json:"newest"`
	Crossed bool       `json:"crossed"`
}

type outboxSummary struct {
	Table            string  `json:"table"`
	Backlog          int64   `json:"backlog"`
	OldestAgeSeconds float64 `json:"oldest_age_seconds"`
	Dead             int64   `json:"dead"`
	Held             int64   `json:"held"`
	Crossed          bool    `json:"crossed"`
}

type stuckSummary struct {
	Table   string `json:"table"`
	Stuck   int64  `json:"stuck"`
	Crossed bool   `json:"crossed"`
}

type dedupSummary struct {
	// Layout is "flat" or "daily" ("" when unknown).
	Layout string `json:"layout"`
	// DailyPartitionsAhead is, with the daily layout, how many days ahead
	// have partitions (below 1: claims dated tomorrow will fail).
	DailyPartitionsAhead *int `json:"daily_partitions_ahead"`
	// RetentionSeconds is the threshold's retention (0: not checked).
	RetentionSeconds float64 `json:"retention_seconds"`
}

func seconds(d *time.Duration) *float64 {
	if d == nil {
		return nil
	}
	s := d.Seconds()
	return &s
}

func (c *Console) overviewPage(w http.ResponseWriter, r *http.Request, rq *request) {
	ctx, cancel := ctxTimeout(r)
	defer cancel()
	o, err := c.overview(ctx)
	if err != nil {
		c.failErr(w, r, rq, "read the overview", err)
		return
	}
	c.render(w, rq, http.StatusOK, "overview", "Overview", o)
}

// overview reads the monitor's snapshot and the dead-letter topics, and
// checks the thresholds. What could not be read is a note.
func (c *Console) overview(ctx context.Context) (*overviewData, error) {
	o := &overviewData{Time: time.Now().UTC(), Consumers: []consumerSummary{}, DeadLetters: []deadLetterTopic{},
		Notes: []string{}, Crossed: []string{}}
	snap, err := c.monitor.Collect(ctx, c.pool)
	if snap == nil {
		return nil, err
	}
	if err != nil {
		o.Notes = append(o.Notes, "partly read: "+err.Error())
	}
	for _, cs := range snap.Consumers {
		s := consumerSummary{Consumer: cs.Name, Topic: cs.Topic, Partitions: []partitionSummary{}, Lag: cs.Lag,
			Parked: cs.Parked, OldestParkedAgeSeconds: seconds(cs.OldestParkedAge), OldestRecordAgeSeconds: seconds(cs.OldestRecordAge)}
		for _, p := range cs.Partitions {
			s.Partitions = append(s.Partitions, partitionSummary{Partition: p.Partition, Position: p.Position,
				StableEnd: p.StableEnd, Lag: p.Lag, Note: p.Note})
		}
		o.Consumers = append(o.Consumers, s)
	}
	if ob := snap.Outbox; ob != nil {
		o.Outbox = outboxOf(ob.Table, ob.Stats)
	}
	if r := snap.Idempotency; r != nil {
		o.Idempotency = &stuckSummary{Table: r.Table, Stuck: r.Stuck}
	}
	for _, t := range snap.Missing {
		o.Notes = append(o.Notes, "no table "+t+" (not migrated, or another schema): run idemkit migrate up")
	}
	o.Notes = append(o.Notes, snap.Notes...)
	o.Dedup.DailyPartitionsAhead = snap.DailyPartitionsAhead
	o.Dedup.RetentionSeconds = c.cfg.Thresholds.Retention.Seconds()
	if l, err := c.dedup.Layout(ctx, c.pool); err == nil {
		o.Dedup.Layout = "flat"
		if l.Daily() {
			o.Dedup.Layout = "daily"
		}
	} else if !errors.Is(err, dedup.ErrNotMigrated) {
		o.Notes = append(o.Notes, "dedup layout: "+err.Error())
	}
	if err := c.deadLetterSummary(ctx, o); err != nil {
		o.Notes = append(o.Notes, "dead-letter topics: "+err.Error())
	}
	c.check(o)
	return o, nil
}

// deadLetterTopics lists the dead-letter topics the cluster has, sorted,
// and notes the configured ones it lacks.
func (c *Console) deadLetterTopics(ctx context.Context) ([]string, []string, error) {
	md, err := c.client.Metadata(ctx, &kafka.MetadataRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("list topics: %w", c.cfg.Kafka.Wrap(err))
	}
	var topics, notes []string
	for _, t := range md.Topics {
		if t.Error == nil && c.isDeadLetterTopic(t.Name) {
			topics = append(topics, t.Name)
		}
	}
	slices.Sort(topics)
	for _, name := range c.cfg.DLQTopics {
		if !slices.Contains(topics, name) {
			notes = append(notes, "dead-letter topic "+name+" (DLQTopics) does not exist")
		}
	}
	return topics, notes, nil
}

// deadLetterSummary counts the dead-letter topics' records from their
// offsets and their origin messages per state from one listing of them
// all, as idemkit status does.
func (c *Console) deadLetterSummary(ctx context.Context, o *overviewData) error {
	topics, notes, err := c.deadLetterTopics(ctx)
	if err != nil {
		return err
	}
	o.Notes = append(o.Notes, notes...)
	if len(topics) == 0 {
		return nil
	}
	for _, t := range topics {
		ranges, err := kafkaoffsets.LogRange(ctx, c.client, t)
		if err != nil {
			return fmt.Errorf("log range of %s: %w", t, c.cfg.Kafka.Wrap(err))
		}
		var n int64
		for _, r := range ranges {
			n += r.End - r.Start
		}
		o.DeadLetters = append(o.DeadLetters, deadLetterTopic{Topic: t, Records: n, States: map[dlq.State]int{}})
	}
	// One listing of them all: a message whose rounds went to several
	// topics (routes) counts once, in the topic of its latest round. A topic
	// deleted since the metadata was read is left out.
	var l *dlq.Listing
	var noReplays bool
	for {
		l, noReplays, err = c.list(ctx, &dlq.ListConfig{Topics: topics, NoPayload: true, DropHeaders: true,
			Window: &dlq.Window{}}) // counts only
		if !errors.Is(err, dlq.ErrNoTopic) {
			break
		}
		i := slices.IndexFunc(topics, func(t string) bool { return strings.HasSuffix(err.Error(), ": "+t) }) // ErrNoTopic names it last
		if i < 0 {
			break
		}
		gone := topics[i]
		o.Notes = append(o.Notes, "dead-letter topic "+gone+" was deleted while it was read")
		topics = slices.Delete(slices.Clone(topics), i, i+1)
		o.DeadLetters = slices.DeleteFunc(o.DeadLetters, func(d deadLetterTopic) bool { return d.Topic == gone })
		if len(topics) == 0 {
			return nil
		}
	}
	if err != nil {
		return err
	}
	if noReplays {
		o.Notes = append(o.Notes, noReplaysNote)
	}
	for i := range o.DeadLetters {
		d := &o.DeadLetters[i]
		tc := l.ByTopic[d.Topic]
		d.States = tc.States
		d.Unresolved = d.States[dlq.StateUnresolved]
		for _, m := range l.Unreadable {
			if m.Topic == d.Topic {
				d.Unreadable++
			}
		}
		if !tc.Oldest.IsZero() {
			oldest, newest := tc.Oldest.UTC(), tc.Newest.UTC()
			d.Oldest, d.Newest = &oldest, &newest
		}
	}
	return nil
}

// noReplaysNote says why dead letters have no state.
const noReplaysNote = "no dead-letter replay records table: every dead-lettered message counted as unresolved (run idemkit migrate up)"

// list runs dlq.List with the console's Kafka and tables; without the
// replay records table every message is unresolved (noReplays).
func (c *Console) list(ctx context.Context, cfg *dlq.ListConfig) (l *dlq.Listing, noReplays bool, err error) {
	cfg.Kafka, cfg.Tables = c.cfg.Kafka, c.tables
	l, err = dlq.List(ctx, c.pool, cfg)
	if errors.Is(err, dlq.ErrNotMigrated) {
		noReplays = true
		if l, err = dlq.List(ctx, nil, cfg); err == nil {
			for _, n := range append([]map[dlq.State]int{l.States}, topicStates(l)...) {
				if n[""] > 0 {
					n[dlq.StateUnresolved] += n[""]
				}
				delete(n, "")
			}
			for i := range l.Messages {
				m := &l.Messages[i]
				m.State = dlq.StateUnresolved
				for j := range m.Letters {
					m.Letters[j].State = dlq.StateUnresolved
				}
			}
		}
	}
	if err != nil {
		return nil, false, fmt.Errorf("read dead letters: %w", err)
	}
	return l, noReplays, nil
}

// topicStates are the counts per state of l.ByTopic.
func topicStates(l *dlq.Listing) []map[dlq.State]int {
	var out []map[dlq.State]int
	for _, c := range l.ByTopic {
		out = append(out, c.States)
	}
	return out
}

// check compares the overview with the thresholds, as idemkit status.
func (c *Console) check(o *overviewData) {
	th := c.cfg.Thresholds
	cross := func(format string, args ...any) { o.Crossed = append(o.Crossed, fmt.Sprintf(format, args...)) }
	for i := range o.Consumers {
		cs := &o.Consumers[i]
		if th.MaxLag >= 0 && cs.Lag > th.MaxLag {
			cs.Crossed = true
			cross("consumer %s on %s: lag %d > %d", cs.Consumer, cs.Topic, cs.Lag, th.MaxLag)
		}
		if age := cs.OldestParkedAgeSeconds; th.MaxParkedAge >= 0 && age != nil && *age > th.MaxParkedAge.Seconds() {
			cs.Crossed = true
			cross("consumer %s on %s: a message parked for %s > %s", cs.Consumer, cs.Topic, secs(*age), th.MaxParkedAge)
		}
		if age := cs.OldestRecordAgeSeconds; th.Retention > 0 && age != nil && *age > 1.25*th.Retention.Seconds() {
			cs.Crossed = true
			cross("consumer %s: oldest processed record %s old > 1.25 × retention %s (purge behind)", cs.Consumer, secs(*age), th.Retention)
		}
	}
	for i := range o.DeadLetters {
		d := &o.DeadLetters[i]
		if th.MaxDLQ >= 0 && int64(d.Unresolved) > th.MaxDLQ {
			d.Crossed = true
			cross("dead-letter topic %s: %d unresolved origin messages > %d", d.Topic, d.Unresolved, th.MaxDLQ)
		}
	}
	if ob := o.Outbox; ob != nil && th.MaxOutboxAge >= 0 && ob.Backlog > 0 && ob.OldestAgeSeconds > th.MaxOutboxAge.Seconds() {
		ob.Crossed = true
		cross("outbox %s: oldest unpublished message %s old > %s", ob.Table, secs(ob.OldestAgeSeconds), th.MaxOutboxAge)
	}
	if r := o.Idempotency; r != nil && th.MaxStuck >= 0 && r.Stuck > th.MaxStuck {
		r.Crossed = true
		cross("idempotency records %s: %d stuck in flight > %d", r.Table, r.Stuck, th.MaxStuck)
	}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)).Round(time.Second) }

// stateOrder is the order in which states are shown.
var stateOrder = []dlq.State{dlq.StateUnresolved, dlq.StateReplayed, dlq.StateApplied, dlq.StateExhausted,
	dlq.StateSuperseded, dlq.StateBeyondHorizon}

// statesText says n in stateOrder ("2 unresolved, 1 applied").
func statesText(n map[dlq.State]int) string {
	var parts []string
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
