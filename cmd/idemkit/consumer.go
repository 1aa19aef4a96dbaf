package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/kafkaoffsets"
	"github.com/idemkit/idemkit/migrate"
)

const positionsHelp = `Shows, per partition of the topic, where a consumer stands: its position in
PostgreSQL (the next offset, written with the effects; its incarnation and
anchor time), the group's committed offset in Kafka, the offsets the partition
holds (log start and end), its stable end (the last stable offset: where the
oldest transaction still open begins, or the log end when none is open), and
the lag: the offsets the consumer can read now (transaction markers and
records of aborted transactions take offsets too), from where it starts (the
later of position and committed offset) or the log start, whichever is later,
to the stable end. The consumer reads committed data only: the records of a
transaction still open, and every record after its first one, wait until it
commits or aborts, and are not counted.
NOTE flags a partition held by an open transaction (stable end before the log
end; a producer that hangs holds it until its transaction times out), a
position past the log end (the topic was deleted and created again, or lost
records: see idemkit consumer seek -recreated), a position below the log start
(records deleted by retention before the consumer got to them: the range is
lost), and positions of partitions the topic does not have.
-json prints the same as one JSON object; null means "none" or "not known",
last_stable is the stable end, and position_lag and committed_lag are the log
end minus each, as they are.
`

const seekHelp = `Moves a consumer, backwards or forwards, in PostgreSQL and in Kafka together:
its positions (one transaction; anchor times cleared) and its group's committed
offsets. The consumer starts each partition at the later of the two, so this,
not kafka-consumer-groups --reset-offsets (which moves only Kafka's), is how to
rewind it: a rewind of Kafka's offsets alone is silently undone. A rewind
delivers the records again; those whose message IDs the consumer already
applied are still skipped as duplicates, so only what never committed runs.

Exactly one target:
  -to-offset N     every chosen partition to offset N, which must lie within
                   each partition's log [start, end]: an offset outside is an
                   error (use -to-earliest or -to-latest for the bounds)
  -to-time T       the first record at or after T (RFC 3339); the log end
                   where no record is that recent
  -to-earliest     the log start: the oldest record still held
  -to-latest       the log end (the stable end while a transaction is open, so
                   that its records are not skipped if it commits): only
                   records written from now on

The group must have no live member: stop the consumers first (a running
consumer would write its own positions over the seek). -force removes live
members from the group instead (they join again and start at the new offsets;
a transaction they have in flight may still move a position forward).
A position past the log end means the topic was deleted and created again (or
lost records): seek refuses unless -recreated says so; -recreated also moves
every position onto a new incarnation, so that message IDs made from
coordinates and dead-letter replay records never match the old topic's (it
applies to every partition, and sets positions of partitions the new topic
does not have to 0). A consumer with no position on the topic is refused as a
likely typo in -name (which defaults to -group) unless -new.
-dry-run makes the same checks and prints the plan without changing anything.
Nothing is asked interactively; a refusal changes nothing. Running the same
seek again moves nothing further (but -recreated counts one more incarnation).
`

type consumerFlags struct {
	conn
	table, group, topic, name string
	json                      bool

	toOffset                int64
	toTime                  string
	toEarliest, toLatest    bool
	partitions              string
	recreated, isNew, force bool
	dryRun                  bool
	target                  string // the target flag given: "to-offset", "to-time", …
	at                      time.Time
	only                    []int // -partitions, sorted; nil: all
}

// consumerCmd runs `idemkit consumer positions|seek`.
func consumerCmd(ctx context.Context, cmd *command, args []string, out io.Writer) error {
	sub := cmd.sub()
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	var f consumerFlags
	f.register(fs)
	fs.StringVar(&f.table, "table", migrate.ConsumerPositionsDefault, "consumer positions table")
	fs.StringVar(&f.group, "group", "", "the consumer's Kafka consumer group (required)")
	fs.StringVar(&f.topic, "topic", "", "the topic it consumes (required)")
	fs.StringVar(&f.name, "name", "", "the consumer's name in PostgreSQL, its Config.Name (default: the group)")
	if sub == "positions" {
		fs.BoolVar(&f.json, "json", false, "print JSON")
	} else {
		fs.Int64Var(&f.toOffset, "to-offset", 0, "target: this offset in every chosen partition")
		fs.StringVar(&f.toTime, "to-time", "", "target: the first record at or after this time (RFC 3339)")
		fs.BoolVar(&f.toEarliest, "to-earliest", false, "target: the log start")
		fs.BoolVar(&f.toLatest, "to-latest", false, "target: the log end (the stable end while a transaction is open)")
		fs.StringVar(&f.partitions, "partitions", "", "only these partitions, e.g. 0,2 (default: all)")
		fs.BoolVar(&f.recreated, "recreated", false, "the topic was deleted and created again: start a new incarnation")
		fs.BoolVar(&f.isNew, "new", false, "the consumer has no position yet: create them")
		fs.BoolVar(&f.force, "force", false, "remove the group's live members instead of refusing")
		fs.BoolVar(&f.dryRun, "dry-run", false, "print the plan, change nothing")
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("consumer %s takes no arguments, got %q", sub, pos)
	}
	if err := f.validate(fs, sub); err != nil {
		return err
	}
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: f.schema, ConsumerPositions: f.table}})
	if err != nil {
		return usagef("%v", err)
	}
	_, client, closeKafka, err := f.dialKafka(ctx)
	if err != nil {
		return err
	}
	defer closeKafka()
	pool, err := connectDB(ctx, f.database)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := f.load(ctx, client, pool, store)
	if err != nil {
		return err
	}
	if sub == "positions" {
		return f.printPositions(st, out)
	}
	return f.seek(ctx, client, pool, store, st, out)
}

func (f *consumerFlags) validate(fs *flag.FlagSet, sub string) error {
	if f.group == "" || f.topic == "" {
		return usagef("consumer %s needs -group and -topic", sub)
	}
	if f.name == "" {
		f.name = f.group
	}
	if err := dedup.ValidateID("-name", f.name); err != nil {
		return usagef("%v", err)
	}
	if sub != "seek" {
		return nil
	}
	var targets []string
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "to-offset", "to-time":
			targets = append(targets, fl.Name)
		case "to-earliest", "to-latest":
			if fl.Value.String() == "true" {
				targets = append(targets, fl.Name)
			}
		}
	})
	if len(targets) != 1 {
		return usagef("consumer seek needs one target: -to-offset N, -to-time T, -to-earliest or -to-latest")
	}
	switch f.target = targets[0]; f.target {
	case "to-offset":
		if f.toOffset < 0 {
			return usagef("-to-offset: %d is negative", f.toOffset)
		}
	case "to-time":
		var err error
		if f.at, err = time.Parse(time.RFC3339, f.toTime); err != nil {
			return usagef("-to-time: %q is not an RFC 3339 time (e.g. 2026-11-30T08:00:00Z)", f.toTime)
		}
	}
	if f.partitions != "" {
		for _, s := range strings.Split(f.partitions, ",") {
			p, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || p < 0 {
				return usagef("-partitions: want partition numbers like 0,2, not %q", f.partitions)
			}
			if !slices.Contains(f.only, p) {
				f.only = append(f.only, p)
			}
		}
		slices.Sort(f.only)
		if f.recreated {
			return usagef("-recreated applies to the whole topic: drop -partitions")
		}
	}
	return nil
}

// state is what PostgreSQL and Kafka say about the consumer and the topic.
type state struct {
	partitions []int // the topic's
	ranges     map[int]kafkaoffsets.Range
	committed  map[int]int64
	group      kafkaoffsets.Group
	positions  map[int]dedup.Position
}

func (f *consumerFlags) load(ctx context.Context, client *kafka.Client, pool *pgxpool.Pool, store *dedup.Store) (*state, error) {
	var st state
	var err error
	st.partitions, err = kafkaoffsets.Partitions(ctx, client, f.topic)
	if errors.Is(err, kafkaoffsets.ErrNoTopic) {
		return nil, fmt.Errorf("topic %s does not exist", f.topic)
	}
	if err != nil {
		return nil, err
	}
	if st.ranges, err = kafkaoffsets.LogRange(ctx, client, f.topic, st.partitions...); err != nil {
		return nil, err
	}
	if st.committed, err = kafkaoffsets.Committed(ctx, client, f.group, f.topic, st.partitions); err != nil {
		return nil, err
	}
	if st.group, err = kafkaoffsets.Describe(ctx, client, f.group); err != nil {
		return nil, err
	}
	list, err := store.ListPositions(ctx, pool, f.name, f.topic)
	if err != nil {
		return nil, f.pgErr(err)
	}
	st.positions = map[int]dedup.Position{}
	for _, p := range list {
		st.positions[p.Partition] = p
	}
	return &st, nil
}

// pgErr says what to do when the positions table is missing or lacks a
// column of the current schema.
func (f *consumerFlags) pgErr(err error) error {
	var pg *pgconn.PgError
	switch {
	case !errors.As(err, &pg):
		return err
	case pg.Code == "42P01": // undefined_table
		return &notMigratedError{schema: f.schema, what: "no table " + f.table + "; or pass -table", err: err}
	case pg.Code == "42703": // undefined_column
		return &notMigratedError{schema: f.schema, what: "table " + f.table + " lacks columns of the current schema", err: err}
	}
	return err
}

// positionRow is one line of `consumer positions`; pointers are null when
// not known.
type positionRow struct {
	Partition    int        `json:"partition"`
	Position     *int64     `json:"position"`
	Incarnation  *int64     `json:"incarnation"`
	AnchorTime   *time.Time `json:"anchor_time"`
	UpdatedAt    *time.Time `json:"position_updated_at"`
	Committed    *int64     `json:"committed"`
	LogStart     *int64     `json:"log_start"`
	LogEnd       *int64     `json:"log_end"`
	LastStable   *int64     `json:"last_stable"`
	Lag          *int64     `json:"lag"`
	PositionLag  *int64     `json:"position_lag"`
	CommittedLag *int64     `json:"committed_lag"`
	Flags        []string   `json:"flags"`
}

// Flags of a positions row.
const (
	flagPastEnd             = "past_log_end"
	flagBelowStart          = "below_log_start"
	flagCommittedPastEnd    = "committed_past_log_end"
	flagCommittedBelowStart = "committed_below_log_start"
	flagNotInTopic          = "not_in_topic"
	flagHeld                = "held_by_open_transaction"
)

func ptr[T any](v T) *T { return &v }

// rows joins the positions and Kafka's offsets per partition: the topic's
// partitions, then those that have a position but are not in the topic.
func (st *state) rows() []positionRow {
	ids := slices.Clone(st.partitions)
	for p := range st.positions {
		if !slices.Contains(ids, p) {
			ids = append(ids, p)
		}
	}
	slices.Sort(ids)
	out := make([]positionRow, 0, len(ids))
	for _, id := range ids {
		r := positionRow{Partition: id, Flags: []string{}}
		pos, hasPos := st.positions[id]
		if hasPos {
			r.Position, r.Incarnation, r.UpdatedAt = ptr(pos.Next), ptr(pos.Incarnation), ptr(pos.UpdatedAt)
			if !pos.AnchorTime.IsZero() {
				r.AnchorTime = ptr(pos.AnchorTime)
			}
		}
		if c, ok := st.committed[id]; ok {
			r.Committed = ptr(c)
		}
		rg, inTopic := st.ranges[id]
		if !inTopic {
			r.Flags = append(r.Flags, flagNotInTopic)
			out = append(out, r)
			continue
		}
		r.LogStart, r.LogEnd, r.LastStable = ptr(rg.Start), ptr(rg.End), ptr(rg.Stable)
		if rg.Held() {
			r.Flags = append(r.Flags, flagHeld)
		}
		var start *int64 // where the consumer starts: the later of the two
		if r.Position != nil {
			r.PositionLag = ptr(rg.End - *r.Position)
			start = r.Position
			switch {
			case *r.Position > rg.End:
				r.Flags = append(r.Flags, flagPastEnd)
			case *r.Position < rg.Start:
				r.Flags = append(r.Flags, flagBelowStart)
			}
		}
		if r.Committed != nil {
			r.CommittedLag = ptr(rg.End - *r.Committed)
			if start == nil || *r.Committed > *start {
				start = r.Committed
			}
			switch {
			case *r.Committed > rg.End:
				r.Flags = append(r.Flags, flagCommittedPastEnd)
			case *r.Committed < rg.Start:
				r.Flags = append(r.Flags, flagCommittedBelowStart)
			}
		}
		if start != nil {
			// What it can read now: records below the log start are gone,
			// and those from the stable end on wait for an open
			// transaction. Negative only past the log end.
			lag := rg.Stable - max(*start, rg.Start)
			if lag < 0 && *start <= rg.End {
				lag = 0 // at or past the stable end: waiting for the transaction
			}
			r.Lag = ptr(lag)
		}
		out = append(out, r)
	}
	return out
}

func (f *consumerFlags) printPositions(st *state, out io.Writer) error {
	rows := st.rows()
	if f.json {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Topic      string        `json:"topic"`
			Group      string        `json:"group"`
			Name       string        `json:"name"`
			GroupState string        `json:"group_state"`
			Members    int           `json:"members"`
			Partitions []positionRow `json:"partitions"`
		}{f.topic, f.group, f.name, st.group.State, len(st.group.Members), rows})
	}
	fmt.Fprintf(out, "topic %s, group %s (%s, %d member(s)), consumer %s\n", f.topic, f.group,
		st.group.State, len(st.group.Members), f.name)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PARTITION\tPOSITION\tINCARNATION\tANCHOR\tCOMMITTED\tLOG START\tSTABLE END\tLOG END\tLAG\tNOTE")
	recreated := false
	for _, r := range rows {
		anchor := "-"
		if r.AnchorTime != nil {
			anchor = r.AnchorTime.UTC().Format(time.RFC3339)
		}
		var notes []string
		for _, fl := range r.Flags {
			switch fl {
			case flagPastEnd:
				recreated = true
				notes = append(notes, "position past the log end")
			case flagBelowStart:
				notes = append(notes, fmt.Sprintf("offsets %d..%d deleted unread", *r.Position, *r.LogStart-1))
			case flagCommittedPastEnd:
				notes = append(notes, "committed offset past the log end")
			case flagCommittedBelowStart:
				notes = append(notes, "committed offset below the log start")
			case flagNotInTopic:
				notes = append(notes, "the topic has no such partition")
			case flagHeld:
				notes = append(notes, fmt.Sprintf("held by an open transaction: offsets %d..%d wait for it", *r.LastStable, *r.LogEnd-1))
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Partition, num(r.Position), num(r.Incarnation), anchor,
			num(r.Committed), num(r.LogStart), num(r.LastStable), num(r.LogEnd), num(r.Lag), strings.Join(notes, "; "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if recreated {
		fmt.Fprintf(out, "a position past the log end means the topic was deleted and created again, or lost records:\n"+
			"  idemkit consumer seek -group %s -topic %s -recreated -to-earliest (see -h)\n", f.group, f.topic)
	}
	return nil
}

func num(v *int64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatInt(*v, 10)
}

// seek moves the positions and the committed offsets.
func (f *consumerFlags) seek(ctx context.Context, client *kafka.Client, pool *pgxpool.Pool, store *dedup.Store,
	st *state, out io.Writer) error {
	chosen := st.partitions
	if f.only != nil {
		for _, p := range f.only {
			if _, ok := st.ranges[p]; !ok {
				return fmt.Errorf("topic %s has no partition %d (it has %s)", f.topic, p, joinInts(st.partitions))
			}
		}
		chosen = f.only
	}
	if len(st.positions) == 0 && !f.isNew {
		return fmt.Errorf("consumer %s has no position on topic %s: check -name (the consumer's Config.Name, "+
			"which defaults to its group) and -schema, or pass -new to seek a consumer that has not run yet", f.name, f.topic)
	}
	target, err := f.targetsFor(ctx, client, st, chosen)
	if err != nil {
		return err
	}
	if st.group.Live() && !f.force {
		return fmt.Errorf("group %s has %d live member(s) (state %s): stop its consumers first "+
			"(a running consumer writes its positions over a seek), or pass -force to remove them from the group; nothing changed",
			f.group, len(st.group.Members), st.group.State)
	}
	commit := maps.Clone(target) // Kafka's: partitions of the topic only
	pgTarget := maps.Clone(target)
	if f.recreated {
		for p := range st.positions {
			if _, ok := st.ranges[p]; !ok {
				pgTarget[p] = 0 // should the partition come back, the new incarnation starts at 0
			}
		}
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	before, after, err := store.SeekTx(ctx, tx, f.name, f.topic, pgTarget, f.recreated)
	if err != nil {
		return f.pgErr(err)
	}
	if !f.recreated {
		for _, b := range before {
			if rg := st.ranges[b.Partition]; b.Next > rg.End {
				return fmt.Errorf("partition %d: position %d is past the log end %d: the topic was deleted and created again, "+
					"or lost records; pass -recreated to move the consumer onto the new incarnation; nothing changed",
					b.Partition, b.Next, rg.End)
			}
		}
	}
	plan := f.plan(st, before, after, commit)
	if f.dryRun {
		if err := plan(out); err != nil {
			return err
		}
		if st.group.Live() {
			fmt.Fprintf(out, "would remove %d live member(s) from group %s\n", len(st.group.Members), f.group)
		}
		fmt.Fprintf(out, "dry run, nothing changed: would move %d partition(s)\n", len(after))
		return nil
	}

	removed, err := f.commitKafka(ctx, client, commit)
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("group %s's Kafka offsets were moved but the PostgreSQL transaction failed: "+
			"run the same seek again: %w", f.group, err)
	}
	if err := plan(out); err != nil {
		return err
	}
	if removed > 0 {
		fmt.Fprintf(out, "removed %d live member(s) from group %s: they join again and start at the new offsets; "+
			"check with idemkit consumer positions that none moved a position on meanwhile\n", removed, f.group)
	}
	fmt.Fprintf(out, "moved %d partition(s) of %s for group %s (consumer %s): the consumer starts there at its next assignment\n",
		len(after), f.topic, f.group, f.name)
	return nil
}

// targetsFor returns the offset each chosen partition moves to.
func (f *consumerFlags) targetsFor(ctx context.Context, client *kafka.Client, st *state, chosen []int) (map[int]int64, error) {
	target := make(map[int]int64, len(chosen))
	switch f.target {
	case "to-earliest":
		for _, p := range chosen {
			target[p] = st.ranges[p].Start
		}
	case "to-latest":
		for _, p := range chosen {
			// The stable end: the records of a transaction still open, and
			// what follows it, are not skipped if it commits later.
			target[p] = st.ranges[p].Stable
		}
	case "to-time":
		at, err := kafkaoffsets.AtTime(ctx, client, f.topic, chosen, f.at)
		if err != nil {
			return nil, err
		}
		target = at
	default: // to-offset
		var outside []string
		for _, p := range chosen {
			rg := st.ranges[p]
			if !rg.Contains(f.toOffset) {
				outside = append(outside, fmt.Sprintf("partition %d holds %d..%d", p, rg.Start, rg.End))
			}
			target[p] = f.toOffset
		}
		if outside != nil {
			return nil, fmt.Errorf("-to-offset %d is outside the log (%s): choose an offset within, "+
				"or -to-earliest / -to-latest; nothing changed", f.toOffset, strings.Join(outside, ", "))
		}
	}
	return target, nil
}

// commitKafka commits offsets for the group from outside it. With -force it
// first removes the group's members, and again if one joined before the
// commit, a few times.
func (f *consumerFlags) commitKafka(ctx context.Context, client *kafka.Client, offsets map[int]int64) (removed int, err error) {
	const rounds = 3
	for round := 1; ; round++ {
		if f.force {
			g, err := kafkaoffsets.Describe(ctx, client, f.group)
			if err != nil {
				return removed, err
			}
			if err := kafkaoffsets.RemoveMembers(ctx, client, f.group, g.Members); err != nil {
				return removed, fmt.Errorf("%w; nothing changed", err)
			}
			removed += len(g.Members)
		}
		err := kafkaoffsets.Commit(ctx, client, f.group, f.topic, offsets)
		switch {
		case err == nil:
			return removed, nil
		case errors.Is(err, kafkaoffsets.ErrGroupNotEmpty) && !f.force:
			return removed, fmt.Errorf("a consumer joined group %s meanwhile: stop it, or pass -force; nothing changed", f.group)
		case errors.Is(err, kafkaoffsets.ErrGroupNotEmpty) && round < rounds:
			continue
		case errors.Is(err, kafkaoffsets.ErrGroupNotEmpty):
			return removed, fmt.Errorf("removed members of group %s joined again before each of %d commits: "+
				"stop its consumers; no offset and no position changed", f.group, rounds)
		}
		return removed, fmt.Errorf("%w; no position changed (some of the group's Kafka offsets may have: "+
			"run the same seek again)", err)
	}
}

// plan returns a printer of the moves: positions and committed offsets,
// before → after.
func (f *consumerFlags) plan(st *state, before, after []dedup.Position, commit map[int]int64) func(io.Writer) error {
	was := map[int]dedup.Position{}
	for _, b := range before {
		was[b.Partition] = b
	}
	return func(out io.Writer) error {
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PARTITION\tPOSITION\tCOMMITTED\tINCARNATION\tLOG")
		for _, a := range after {
			pos, inc := "- → "+strconv.FormatInt(a.Next, 10), strconv.FormatInt(a.Incarnation, 10)
			if b, ok := was[a.Partition]; ok {
				pos = fmt.Sprintf("%d → %d", b.Next, a.Next)
				if b.Incarnation != a.Incarnation {
					inc = fmt.Sprintf("%d → %d", b.Incarnation, a.Incarnation)
				}
			} else if f.recreated {
				inc = "- → " + inc
			}
			committed, log := "-", "not in topic"
			if to, ok := commit[a.Partition]; ok {
				committed = "- → " + strconv.FormatInt(to, 10)
				if c, ok := st.committed[a.Partition]; ok {
					committed = fmt.Sprintf("%d → %d", c, to)
				}
				rg := st.ranges[a.Partition]
				log = fmt.Sprintf("%d..%d", rg.Start, rg.End)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", a.Partition, pos, committed, inc, log)
		}
		return tw.Flush()
	}
}

func joinInts(ids []int) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.Itoa(id)
	}
	return strings.Join(s, ",")
}
