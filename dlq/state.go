package dlq

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/internal/pgexec"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
)

// State is where a dead letter stands, from the replay records.
type State string

// States of a dead letter and of an origin message.
const (
	// StateUnresolved: no replay decided it yet.
	StateUnresolved State = "unresolved"
	// StateReplayed: republished to its origin topic; its consumer decides.
	StateReplayed State = "replayed"
	// StateApplied: redriven, or found applied: its effect is committed.
	StateApplied State = "applied"
	// StateExhausted: its replay rounds were used up (the Exhausted
	// action): recorded, never replayed again.
	StateExhausted State = "exhausted"
	// StateSuperseded: it failed again, and a dead letter of a later round
	// stands for its message.
	StateSuperseded State = "superseded"
	// StateBeyondHorizon: recorded as beyond the dedup horizon (its daily
	// dedup partition was dropped): never replayed again.
	StateBeyondHorizon State = "beyond-horizon"
)

// stateOf is the state a replay record's outcome gives its dead letter.
func stateOf(a Action) State {
	switch a {
	case Applied, AlreadyApplied:
		return StateApplied
	case Republished, RepublishedNoID:
		return StateReplayed
	case FailedAgain:
		return StateSuperseded
	case Exhausted:
		return StateExhausted
	case BeyondHorizon:
		return StateBeyondHorizon
	}
	return StateUnresolved
}

// Replay is the replay record of a dead letter.
type Replay struct {
	Outcome         Action    `json:"outcome"`
	Detail          string    `json:"detail,omitempty"`
	DeadLetterTopic string    `json:"dead_letter_topic"`
	ReplayedBy      string    `json:"replayed_by"`
	ReplayedAt      time.Time `json:"replayed_at"`
}

// Letter is a dead letter and its state.
type Letter struct {
	*DeadLetter
	State State
	// Replay is its replay record, nil when it has none.
	Replay *Replay
}

// OriginMessage is an origin message and its dead letters: their copies
// (the same round written twice) and their rounds.
type OriginMessage struct {
	Origin    Origin
	MessageID string
	Consumer  string
	// State is the state of its dead letters of the highest round read
	// (see Latest).
	State State
	// Letters holds its dead letters the filter selected (and the window
	// kept), in the order read.
	Letters []Letter
}

// Listing is what List found in dead-letter topics.
type Listing struct {
	Topics []string
	// Read counts the records read.
	Read int
	// Messages holds the origin messages with a dead letter the filter
	// selected (and ListConfig.Window kept), in the order of their first
	// dead letter read.
	Messages []OriginMessage
	// Selected counts the dead letters the filter selected, in the window
	// or not.
	Selected int
	// States counts the origin messages with a dead letter the filter
	// selected, in the window or not, per state (the empty state: unknown,
	// with no database).
	States map[State]int
	// ByTopic counts the same messages per dead-letter topic, each in the
	// topic of its dead letter of the highest round (its first copy), where
	// a replay would take it. Every topic listed has an entry.
	ByTopic map[string]TopicCount
	// Unreadable holds the records that are not idemkit dead letters.
	Unreadable []kafka.Message
}

// TopicCount is what a listing counted in one dead-letter topic: its
// origin messages per state, and the oldest and newest last failure of
// their dead letters there.
type TopicCount struct {
	States         map[State]int
	Oldest, Newest time.Time
}

// Latest returns m's dead letter of the highest round: the first copy read.
func (m *OriginMessage) Latest() *Letter {
	top := &m.Letters[0]
	for i := range m.Letters {
		if m.Letters[i].Round > top.Round {
			top = &m.Letters[i]
		}
	}
	return top
}

// ListConfig configures List. Kafka.Brokers and Topics are required.
type ListConfig struct {
	// Kafka is how to reach the cluster (see package kafkaconn).
	Kafka kafkaconn.Config
	// Topics are the dead-letter topics to list, read one after the other:
	// the destinations of a Writer with Routes (Writer.Topics), so that the
	// rounds of a message dead-lettered to several of them group together.
	Topics []string
	// Tables says where the replay records table lives (migrate.Tables;
	// the zero value: schema "public", every default name).
	Tables migrate.Tables
	// Filter selects dead letters; the state of each comes from every dead
	// letter of its message, selected or not.
	Filter Filter
	// NoPayload drops each dead letter's key and value once read, so that
	// a large topic can be counted in little memory.
	NoPayload bool
	// DropHeaders drops each dead letter's headers (Message.Headers: the
	// origin message's own and the dead-letter ones) once parsed, keeping
	// what Parse read from them (origin, message ID, history, …): the
	// origin's headers are its producer's to choose, and may be large.
	// Original then has no headers.
	DropHeaders bool
	// Window, when set, keeps only the selected dead letters from the
	// Skip-th (from 0, in the order read) to the Skip+Limit-th: one page of
	// a listing; a Limit of 0 keeps none, to count only. The others are
	// counted (Listing.Selected, States, ByTopic) and dropped as they are
	// read, so a page of a large topic holds its own letters and a few
	// words per origin message. Nil keeps every selected letter.
	Window *Window
}

// Window is a page of a listing: Limit dead letters from the Skip-th.
type Window struct {
	Skip, Limit int
}

func (w *Window) keeps(i int) bool {
	return w == nil || (i >= w.Skip && i-w.Skip < w.Limit)
}

// DBTX runs queries: a *pgxpool.Pool, a *pgx.Conn and a pgx.Tx all
// satisfy it.
type DBTX = pgexec.DB

// List reads dead-letter topics, each from its start to the end it has when
// List reaches it (as Scan), and the replay records of its messages in db (one
// query per few thousand origin messages), and returns each dead letter the
// filter selects with its state, grouped per origin message. It only reads.
// A missing topic is ErrNoTopic (naming it); a missing replay records table
// wraps ErrNotMigrated. It holds the selected letters in memory (see
// ListConfig.NoPayload and Window) and, per origin message, its coordinates.
// With a nil db (nil: none) no replay record is read and every State is left
// empty: unknown. db is a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
func List(ctx context.Context, db DBTX, cfg *ListConfig) (*Listing, error) {
	switch {
	case cfg == nil:
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	case len(cfg.Topics) == 0 || slices.Contains(cfg.Topics, ""):
		return nil, fmt.Errorf("%w: Topics is empty or holds an empty name", ErrInvalidConfig)
	case cfg.Window != nil && (cfg.Window.Skip < 0 || cfg.Window.Limit < 0):
		return nil, fmt.Errorf("%w: Window %+v is negative", ErrInvalidConfig, *cfg.Window)
	}
	tables := cfg.Tables.WithDefaults()
	if err := tables.Validate(); err != nil {
		return nil, err
	}
	replays := pgx.Identifier{tables.Schema, tables.DLQReplays}.Sanitize()
	l := &Listing{States: map[State]int{}, ByTopic: map[string]TopicCount{}}
	for _, t := range cfg.Topics {
		if !slices.Contains(l.Topics, t) { // a topic named twice is read once
			l.Topics = append(l.Topics, t)
			l.ByTopic[t] = TopicCount{States: map[State]int{}}
		}
	}
	// What List holds of every origin message read: a few words, and the
	// origin topic's name once (interned).
	var seen []seenMessage
	index := map[originKey]int32{}
	names := map[string]string{}
	at := 0 // the topic read, in l.Topics
	read := func(m kafka.Message) error {
		l.Read++
		d, err := Parse(m)
		if err != nil {
			if cfg.NoPayload {
				m.Key, m.Value = nil, nil
			}
			if cfg.DropHeaders {
				m.Headers = nil
			}
			l.Unreadable = append(l.Unreadable, m)
			return nil
		}
		name, ok := names[d.Origin.Topic]
		if !ok {
			name = d.Origin.Topic
			names[name] = name
		}
		d.Origin.Topic = name
		k := d.Origin.key()
		i, ok := index[k]
		if !ok {
			i = int32(len(seen))
			index[k] = i
			seen = append(seen, seenMessage{key: k, top: -1, kept: -1})
		}
		sm := &seen[i]
		if int32(d.Round) > sm.top {
			sm.top, sm.topAt, sm.topFail = int32(d.Round), int32(at), 0
			if t := d.Last().LastFailure; !t.IsZero() {
				sm.topFail = t.UnixNano()
			}
		}
		if !cfg.Filter.Match(d) {
			return nil
		}
		sm.selected = true
		l.Selected++
		if !cfg.Window.keeps(l.Selected - 1) {
			return nil
		}
		if cfg.NoPayload {
			d.Message.Key, d.Message.Value = nil, nil
		}
		if cfg.DropHeaders {
			d.Message.Headers = nil
		}
		if sm.kept < 0 {
			sm.kept = int32(len(l.Messages))
			l.Messages = append(l.Messages, OriginMessage{Origin: d.Origin, MessageID: d.MessageID, Consumer: d.Consumer})
		}
		om := &l.Messages[sm.kept]
		om.Letters = append(om.Letters, Letter{DeadLetter: d})
		return nil
	}
	for i, topic := range l.Topics {
		at = i
		if err := Scan(ctx, cfg.Kafka, topic, read); err != nil {
			return nil, err
		}
	}
	index, names = nil, nil                          // read: the GC may have them
	if p, ok := db.(*pgxpool.Pool); ok && p == nil { // a nil pool is no database
		db = nil
	}
	for chunk := range slices.Chunk(seen, replaysChunk) {
		var records map[originKey]map[int]*Replay
		if db != nil {
			var err error
			if records, err = readReplays(ctx, db, replays, chunk); err != nil {
				return nil, err
			}
		}
		for _, sm := range chunk {
			var state State
			var om *OriginMessage
			if sm.kept >= 0 {
				om = &l.Messages[sm.kept]
			}
			if db != nil {
				state = decide(int(sm.top), records[sm.key], om)
			}
			if !sm.selected {
				continue
			}
			l.States[state]++
			tc := l.ByTopic[l.Topics[sm.topAt]]
			tc.States[state]++
			if sm.topFail != 0 {
				at := time.Unix(0, sm.topFail).UTC()
				if tc.Oldest.IsZero() || at.Before(tc.Oldest) {
					tc.Oldest = at
				}
				if at.After(tc.Newest) {
					tc.Newest = at
				}
			}
			l.ByTopic[l.Topics[sm.topAt]] = tc
		}
	}
	return l, nil
}

// seenMessage is what List keeps of an origin message while it reads.
type seenMessage struct {
	key      originKey
	topFail  int64 // the last failure (Unix ns; 0: none) of its first dead letter of round top
	top      int32 // the highest round of its dead letters read
	topAt    int32 // the topic of that dead letter, in Listing.Topics
	kept     int32 // its index in Listing.Messages, -1 when none of its letters is kept
	selected bool  // the filter selected one of its dead letters
}

// decide returns the state of an origin message whose highest round read is
// top, from its replay records by round, and sets the state of m and of its
// dead letters (m may be nil).
func decide(top int, records map[int]*Replay, m *OriginMessage) State {
	last := top // the highest round read or recorded
	for round := range records {
		last = max(last, round)
	}
	state := func(round int) (State, *Replay) {
		r := records[round]
		switch {
		case r != nil && r.Outcome != Republished && r.Outcome != RepublishedNoID:
			return stateOf(r.Outcome), r
		case round < last:
			// Republished and failed again, or failed again without a
			// record (its record was lost): a later round took over.
			return StateSuperseded, r
		case r != nil:
			return StateReplayed, r
		}
		return StateUnresolved, nil
	}
	s, _ := state(top)
	if m != nil {
		m.State = s
		for i := range m.Letters {
			x := &m.Letters[i]
			x.State, x.Replay = state(x.Round)
		}
	}
	return s
}

// replaysChunk bounds the origins of one replay records query.
const replaysChunk = 5000

// readReplays reads the replay records of msgs' origins, per origin and
// round.
func readReplays(ctx context.Context, db DBTX, table string, msgs []seenMessage) (map[originKey]map[int]*Replay, error) {
	out := map[originKey]map[int]*Replay{}
	topics := make([]string, len(msgs))
	incarnations := make([]int64, len(msgs))
	partitions := make([]int32, len(msgs))
	offsets := make([]int64, len(msgs))
	for i, m := range msgs {
		k := m.key
		topics[i], incarnations[i], partitions[i], offsets[i] = k.topic, k.incarnation, int32(k.partition), k.offset
	}
	rows, err := db.Query(ctx, `SELECT r.origin_topic, r.origin_incarnation, r.origin_partition, r.origin_offset,
		r.replay_round, r.outcome, coalesce(r.detail, ''), r.dead_letter_topic, r.replayed_by, r.replayed_at
		FROM `+table+` r JOIN unnest($1::text[], $2::int8[], $3::int4[], $4::int8[]) AS o (topic, incarnation, part, off)
		ON r.origin_topic = o.topic AND r.origin_incarnation = o.incarnation
		AND r.origin_partition = o.part AND r.origin_offset = o.off`,
		topics, incarnations, partitions, offsets)
	if err != nil {
		return nil, replaysError(err)
	}
	var k originKey
	var round int
	var outcome string
	var r Replay
	_, err = pgx.ForEachRow(rows, []any{&k.topic, &k.incarnation, &k.partition, &k.offset, &round, &outcome,
		&r.Detail, &r.DeadLetterTopic, &r.ReplayedBy, &r.ReplayedAt}, func() error {
		r.Outcome = Action(outcome)
		if out[k] == nil {
			out[k] = map[int]*Replay{}
		}
		rec := r
		out[k][round] = &rec
		return nil
	})
	if err != nil {
		return nil, replaysError(err)
	}
	return out, nil
}

func replaysError(err error) error {
	return fmt.Errorf("dlq: read replay records: %w", pgexec.NotMigrated(ErrNotMigrated, err))
}
