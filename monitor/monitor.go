package monitor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/internal/kafkaoffsets"
	"github.com/idemkit/idemkit/internal/pgexec"
	"github.com/idemkit/idemkit/kafkaconn"
	"github.com/idemkit/idemkit/migrate"
	"github.com/idemkit/idemkit/outbox"
)

// ErrInvalidConfig is wrapped by every configuration error of the package.
var ErrInvalidConfig = fmt.Errorf("monitor: %w", idemkit.ErrInvalidConfig)

// Defaults of Config.
const (
	// OldestRecordTimeoutDefault bounds the search for one consumer's
	// oldest processed-message record.
	OldestRecordTimeoutDefault = 5 * time.Second
	// StuckIntervalDefault is how often a Monitor counts the stuck
	// idempotency records.
	StuckIntervalDefault = time.Minute
)

// DB is what Collect reads with: a *pgxpool.Pool, a *pgx.Conn or a
// pgx.Tx.
type DB interface {
	pgexec.DB
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Config says where the tables and the topics are.
type Config struct {
	// Kafka is how to reach the cluster whose log ends the lag is measured
	// against. Brokers is required.
	Kafka kafkaconn.Config
	// Tables says where idemkit's tables live (the zero value: schema
	// "public", every default name).
	Tables migrate.Tables
	// OldestRecordTimeout bounds the search for each consumer's oldest
	// processed-message record (an index walk that other consumers'
	// older records can make long); past it the age is reported unknown.
	// Defaults to OldestRecordTimeoutDefault.
	OldestRecordTimeout time.Duration
	// StuckInterval is how often Collect counts the idempotency records
	// stuck in flight: no index tells them apart, the count scans the
	// table, so a Collect within StuckInterval of the last count reports
	// that count again. Defaults to StuckIntervalDefault.
	StuckInterval time.Duration
}

// Monitor reads Snapshots. It is safe for concurrent use.
type Monitor struct {
	kafka      kafkaconn.Config
	client     *kafka.Client
	closeIdle  func()
	timeout    time.Duration
	sql        statements
	outbox     *outbox.Store
	idem       *idemhttp.Store
	dedup      *dedup.Store
	tables     migrate.Tables
	stuckEvery time.Duration

	mu       sync.Mutex // guards the last count of stuck records
	stuck    *Idempotency
	stuckErr error
	stuckAt  time.Time
}

// statements are the Monitor's queries, one per name.
type statements struct {
	positions    string // consumer, topic, partition, next offset
	parked       string // consumer, topic, count, oldest age
	oldestRecord string // $1 consumer: the age of its oldest record
	// oldestTimeout bounds the search, within its transaction: $1 in ms.
	oldestTimeout string
	today         string // the database's date, UTC
}

// New validates cfg and returns a Monitor. It does not connect.
func New(cfg *Config) (*Monitor, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil config", ErrInvalidConfig)
	}
	if len(cfg.Kafka.Brokers) == 0 {
		return nil, fmt.Errorf("%w: Kafka.Brokers is required", ErrInvalidConfig)
	}
	if cfg.OldestRecordTimeout < 0 || cfg.StuckInterval < 0 {
		return nil, fmt.Errorf("%w: OldestRecordTimeout and StuckInterval must not be negative", ErrInvalidConfig)
	}
	tables := cfg.Tables.WithDefaults()
	if err := tables.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	t, err := cfg.Kafka.Transport()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	m := &Monitor{
		kafka:      cfg.Kafka,
		client:     &kafka.Client{Addr: cfg.Kafka.Addr(), Timeout: 10 * time.Second, Transport: t},
		closeIdle:  t.CloseIdleConnections,
		timeout:    cmp.Or(cfg.OldestRecordTimeout, OldestRecordTimeoutDefault),
		stuckEvery: cmp.Or(cfg.StuckInterval, StuckIntervalDefault),
		tables:     tables,
	}
	id := func(name string) string { return pgx.Identifier{tables.Schema, name}.Sanitize() }
	m.sql = statements{
		positions: `SELECT consumer, topic, kafka_partition, next_offset FROM ` + id(tables.ConsumerPositions) +
			` ORDER BY consumer, topic, kafka_partition`,
		parked: `SELECT consumer, topic, count(*), extract(epoch FROM now() - min(parked_at))::float8 FROM ` +
			id(tables.ParkedMessages) + ` GROUP BY consumer, topic`,
		oldestRecord: `SELECT extract(epoch FROM now() - processed_at)::float8 FROM ` + id(tables.ProcessedMessages) +
			` WHERE consumer = $1 ORDER BY processed_at LIMIT 1`,
		oldestTimeout: `SELECT set_config('statement_timeout', $1, true)`,
		today:         `SELECT (now() AT TIME ZONE 'UTC')::date`,
	}
	if m.outbox, err = outbox.New(&outbox.Config{Tables: tables}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if m.idem, err = idemhttp.NewStore(&idemhttp.StoreConfig{Tables: tables}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if m.dedup, err = dedup.New(&dedup.Config{Tables: tables}); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return m, nil
}

// Close closes the Monitor's idle Kafka connections.
func (m *Monitor) Close() { m.closeIdle() }

// Tables returns where the Monitor reads, defaults applied.
func (m *Monitor) Tables() migrate.Tables { return m.tables }

// Snapshot is the state read by one Collect.
type Snapshot struct {
	// Time is when the collection began.
	Time time.Time
	// Consumers has one entry per consumer name and topic that has a
	// position or a parked message, sorted by name and topic.
	Consumers []Consumer
	// Outbox is nil when the outbox table does not exist.
	Outbox *Outbox
	// Idempotency is nil when the HTTP idempotency records table does not
	// exist.
	Idempotency *Idempotency
	// DailyPartitionsAhead is, with the daily dedup layout, how many days
	// after today (UTC, the database's clock) have partitions without a gap
	// (days before DailyFrom need none); -1 when today has none. Below 1,
	// claims dated tomorrow will fail. Nil with the flat layout.
	DailyPartitionsAhead *int
	// Missing names the tables that do not exist (not migrated, or
	// another schema or name): what they would tell is left out.
	Missing []string
	// Notes say what else could not be read, and why.
	Notes []string
}

// Consumer is one consumer name on one topic.
type Consumer struct {
	Name, Topic string
	// Partitions are the topic's partitions and those with a position, by
	// partition number.
	Partitions []Partition
	// Lag sums the partitions' lag.
	Lag int64
	// Parked counts the consumer's messages in the parked table;
	// OldestParkedAge is the age of the oldest (nil when none).
	Parked          int64
	OldestParkedAge *time.Duration
	// OldestRecordAge is the age of the consumer name's oldest
	// processed-message record (nil when it has none, or the search took
	// longer than OldestRecordTimeout: then a note says so). With the
	// daily layout it is at least the age of the oldest daily partition.
	OldestRecordAge *time.Duration
}

// Partition is a consumer's position on one partition.
type Partition struct {
	Partition int
	// Position is the next offset the consumer processes: its row in the
	// positions table, or the log start when it has none (nothing
	// committed there yet).
	Position int64
	// StableEnd is the partition's last stable offset (what a
	// read_committed consumer can read up to); nil when unknown.
	StableEnd *int64
	// Lag is StableEnd - Position, never below 0; nil when unknown.
	Lag *int64
	// Note says what is odd: no position yet, not in the topic, past the
	// log end.
	Note string
}

// Outbox is the outbox table's state.
type Outbox struct {
	Table string
	outbox.Stats
}

// Idempotency is the HTTP idempotency records table's state.
type Idempotency struct {
	Table string
	// Stuck counts the records in flight past their lease
	// (idemhttp.Store.CountStuck), as of the last count (see
	// Config.StuckInterval).
	Stuck int64
}

// Collect reads a Snapshot through db and the Monitor's Kafka client. A
// missing table is listed in Snapshot.Missing, not an error. Each part
// (consumers and their lag, the outbox, the stuck records, the daily
// partitions) is read even when another failed: the error joins the
// failures, and the snapshot holds every part that was read (a consumer's
// lag is unknown, nil, when its topic's log end could not be read).
func (m *Monitor) Collect(ctx context.Context, db DB) (*Snapshot, error) {
	s := &Snapshot{Time: time.Now(), Consumers: []Consumer{}, Missing: []string{}, Notes: []string{}}
	return s, errors.Join(m.consumers(ctx, db, s), m.outboxState(ctx, db, s), m.records(ctx, db, s), m.daily(ctx, db, s))
}

// missingTable reports whether err is PostgreSQL's undefined_table.
func missingTable(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == "42P01"
}

func (m *Monitor) consumers(ctx context.Context, db DB, s *Snapshot) error {
	type key struct{ name, topic string }
	byKey := map[key]*Consumer{}
	var order []key
	get := func(name, topic string) *Consumer {
		k := key{name, topic}
		c := byKey[k]
		if c == nil {
			c = &Consumer{Name: name, Topic: topic, Partitions: []Partition{}}
			byKey[k] = c
			order = append(order, k)
		}
		return c
	}
	var name, topic string
	var partition int
	var next int64
	rows, err := db.Query(ctx, m.sql.positions)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&name, &topic, &partition, &next}, func() error {
			c := get(name, topic)
			c.Partitions = append(c.Partitions, Partition{Partition: partition, Position: next})
			return nil
		})
	}
	switch {
	case missingTable(err):
		s.Missing = append(s.Missing, m.tables.ConsumerPositions)
		return nil
	case err != nil:
		return fmt.Errorf("monitor: read consumer positions: %w", err)
	}

	var n int64
	var age float64
	rows, err = db.Query(ctx, m.sql.parked)
	if err == nil {
		_, err = pgx.ForEachRow(rows, []any{&name, &topic, &n, &age}, func() error {
			c := get(name, topic) // parked before the consumer wrote any position
			c.Parked, c.OldestParkedAge = n, durationPtr(age)
			return nil
		})
	}
	switch {
	case missingTable(err):
		s.Missing = append(s.Missing, m.tables.ParkedMessages)
	case err != nil:
		return fmt.Errorf("monitor: read parked messages: %w", err)
	}

	// The oldest record of each consumer name: an index walk that other
	// consumers' older records can make long. Bounded on the server
	// (statement_timeout in its own transaction), so that a slow one
	// leaves the connection usable; after one took too long, the others of
	// this collection are not searched.
	oldest := map[string]*time.Duration{}
	var slow bool
	var errs []error
	for _, k := range order {
		if _, done := oldest[k.name]; done {
			continue
		}
		oldest[k.name] = nil
		if slow {
			continue
		}
		age, err := m.oldestRecord(ctx, db, k.name)
		var pg *pgconn.PgError
		switch {
		case err == nil:
			oldest[k.name] = age
		case errors.As(err, &pg) && pg.Code == "57014": // query_canceled: the statement_timeout
			slow = true
			s.Notes = append(s.Notes, fmt.Sprintf("the oldest processed record of %s took longer than %s to find: unknown (and not searched for the other consumers)", k.name, m.timeout))
		default:
			errs = append(errs, fmt.Errorf("monitor: read the oldest processed record of %s: %w", k.name, err))
		}
	}

	ends := map[string]map[int]kafkaoffsets.Range{}
	for _, k := range order {
		c := byKey[k]
		c.OldestRecordAge = oldest[k.name]
		r, ok := ends[k.topic]
		if !ok {
			var err error
			if r, err = m.logEnds(ctx, k.topic); err != nil {
				errs = append(errs, err) // this topic's lag is unknown; the others go on
			}
			ends[k.topic] = r
		}
		// Partitions without a position row (nothing committed there: a
		// first message stuck in its handler, or never read) wait from
		// the log start.
		for id, rg := range r {
			if !slices.ContainsFunc(c.Partitions, func(p Partition) bool { return p.Partition == id }) {
				c.Partitions = append(c.Partitions, Partition{Partition: id, Position: rg.Start,
					Note: "no position yet: counted from the log start"})
			}
		}
		slices.SortFunc(c.Partitions, func(a, b Partition) int { return a.Partition - b.Partition })
		for i := range c.Partitions {
			p := &c.Partitions[i]
			if r == nil {
				continue // Kafka did not answer: the lag is unknown
			}
			rg, ok := r[p.Partition]
			if !ok {
				p.Note = "not in the topic"
				continue
			}
			lag := max(rg.Stable-p.Position, 0)
			if p.Position > rg.End {
				// The topic was recreated: the position points past its
				// log, and everything it holds waits (the runner stops on
				// it by default: see consumer.Config.OnRecreated).
				lag = rg.Stable - rg.Start
				p.Note = "past the log end (topic recreated?): every message of the topic counted as waiting"
			}
			p.StableEnd, p.Lag = &rg.Stable, &lag
			c.Lag += lag
		}
	}
	slices.SortFunc(order, func(a, b key) int { return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.topic, b.topic)) })
	for _, k := range order {
		s.Consumers = append(s.Consumers, *byKey[k])
	}
	return errors.Join(errs...)
}

// oldestRecord returns the age of name's oldest processed-message record
// (nil when it has none), the search bounded by the server to the
// Monitor's OldestRecordTimeout.
func (m *Monitor) oldestRecord(ctx context.Context, db DB, name string) (*time.Duration, error) {
	var age *float64
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, m.sql.oldestTimeout, strconv.FormatInt(m.timeout.Milliseconds(), 10)); err != nil {
			return err
		}
		return tx.QueryRow(ctx, m.sql.oldestRecord, name).Scan(&age)
	})
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	case err != nil:
		return nil, err
	case age == nil:
		return nil, nil
	}
	return durationPtr(*age), nil
}

// logEnds reads topic's partitions' log ranges; a topic that does not
// exist has none.
func (m *Monitor) logEnds(ctx context.Context, topic string) (map[int]kafkaoffsets.Range, error) {
	parts, err := kafkaoffsets.Partitions(ctx, m.client, topic)
	switch {
	case errors.Is(err, kafkaoffsets.ErrNoTopic):
		return map[int]kafkaoffsets.Range{}, nil
	case err != nil:
		return nil, fmt.Errorf("monitor: partitions of %s: %w", topic, m.kafka.Wrap(err))
	}
	r, err := kafkaoffsets.LogRange(ctx, m.client, topic, parts...)
	if err != nil {
		return nil, fmt.Errorf("monitor: log range of %s: %w", topic, m.kafka.Wrap(err))
	}
	return r, nil
}

func (m *Monitor) outboxState(ctx context.Context, db DB, s *Snapshot) error {
	st, err := m.outbox.Stats(ctx, db)
	switch {
	case errors.Is(err, outbox.ErrNotMigrated):
		s.Missing = append(s.Missing, m.tables.Outbox)
		return nil
	case err != nil:
		return fmt.Errorf("monitor: %w", err)
	}
	s.Outbox = &Outbox{Table: m.tables.Outbox, Stats: st}
	return nil
}

func (m *Monitor) records(ctx context.Context, db DB, s *Snapshot) error {
	m.mu.Lock()
	last, lastErr, at := m.stuck, m.stuckErr, m.stuckAt
	m.mu.Unlock()
	if at.IsZero() || time.Since(at) >= m.stuckEvery {
		last, lastErr = nil, nil
		n, err := m.idem.CountStuck(ctx, db)
		switch {
		case errors.Is(err, idemhttp.ErrNotMigrated):
		case err != nil:
			lastErr = fmt.Errorf("monitor: %w", err)
		default:
			last = &Idempotency{Table: m.tables.IdempotencyRecords, Stuck: n}
		}
		// A failed count is not tried again before StuckInterval either:
		// the scan that failed (a lock, a timeout) would fail again.
		m.mu.Lock()
		m.stuck, m.stuckErr, m.stuckAt = last, lastErr, time.Now()
		m.mu.Unlock()
	}
	s.Idempotency = last
	if last == nil && lastErr == nil {
		s.Missing = append(s.Missing, m.tables.IdempotencyRecords)
	}
	return lastErr
}

// daily counts the days of daily partitions ahead of today, with the
// daily layout.
func (m *Monitor) daily(ctx context.Context, db DB, s *Snapshot) error {
	l, err := m.dedup.Layout(ctx, db)
	switch {
	case errors.Is(err, dedup.ErrNotMigrated):
		return nil // the positions table is missing too
	case err != nil:
		return fmt.Errorf("monitor: %w", err)
	}
	if !l.Daily() {
		return nil
	}
	parts, err := m.dedup.Partitions(ctx, db)
	if err != nil {
		return fmt.Errorf("monitor: %w", err)
	}
	var today time.Time
	if err := db.QueryRow(ctx, m.sql.today).Scan(&today); err != nil {
		return fmt.Errorf("monitor: read the date: %w", err)
	}
	// The last day covered without a gap from the first day that needs a
	// partition (today, or DailyFrom while it is ahead): a hole before the
	// newest partition is where claims would fail first.
	have := make(map[time.Time]bool, len(parts))
	for _, p := range parts {
		have[p.Day] = true
	}
	now := time.Date(today.Year(), today.Month(), today.Day(), 0, 0, 0, 0, time.UTC)
	day := now
	if l.DailyFrom.After(day) {
		day = l.DailyFrom
	}
	for have[day] {
		day = day.AddDate(0, 0, 1)
	}
	ahead := int(day.Sub(now)/(24*time.Hour)) - 1
	s.DailyPartitionsAhead = &ahead
	// The daily table's records are as old as its oldest partition at most,
	// and retention drops whole partitions: a partition older than the
	// flat table's oldest record makes the consumers' oldest age (an upper
	// bound, for every consumer of the schema).
	if len(parts) > 0 && parts[0].Day.Before(now) {
		old := time.Since(parts[0].Day)
		for i := range s.Consumers {
			if a := s.Consumers[i].OldestRecordAge; a == nil || *a < old {
				s.Consumers[i].OldestRecordAge = &old
			}
		}
	}
	return nil
}

func durationPtr(seconds float64) *time.Duration {
	d := time.Duration(max(seconds, 0) * float64(time.Second))
	return &d
}
