package dedup

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/migrate"
)

// Layout says where a schema stores its claims (see "Daily partitions" in
// the package documentation). The zero Layout is the flat one: every claim
// in the processed-messages table.
type Layout struct {
	// DailyFrom is the first day (UTC, of UUIDv7 time) whose UUIDv7 IDs are
	// stored in the daily table; the zero time while the layout is flat.
	DailyFrom time.Time
	// Ready is false while the switch is still in progress (EnableDaily, or
	// the next MaintainPartitions after an EnableDaily that was
	// interrupted): claims then stay in the flat table, and those the switch
	// moves fail with ErrLayoutChanged until it is done.
	Ready bool
	// KeepDays is how many days of partitions MaintainPartitions keeps
	// behind today; 0 means it drops none.
	KeepDays int
	// AheadDays is how many days of partitions MaintainPartitions creates
	// ahead of today.
	AheadDays int
	// DroppedBefore is the retention's watermark: the days before it were
	// dropped, and are never created again (a claim dated then fails with
	// ErrPartitionDropped). The zero time when none was dropped.
	DroppedBefore time.Time
}

// Daily reports whether UUIDv7 IDs from DailyFrom on are stored in the
// daily table.
func (l Layout) Daily() bool { return l.Ready && !l.DailyFrom.IsZero() }

// DailyConfig configures the daily layout (EnableDaily).
type DailyConfig struct {
	// KeepDays is how many whole days of partitions behind today
	// MaintainPartitions keeps: a partition whose every ID is KeepDays or
	// more days old is dropped. Choose it as the retention you would give
	// Store.Purge, and longer than the oldest ID a message can arrive with
	// (an outbox message requeued after days dead, a dead letter replayed): an ID
	// whose partition is dropped can no longer be deduplicated, and its
	// message is refused (ErrPartitionDropped), however fresh its delivery.
	// 0 leaves the setting as it is (none, for a new layout: every
	// partition kept); -1 keeps every partition from now on.
	KeepDays int
	// AheadDays is how many days of partitions are created ahead of today,
	// so that claims never wait for one; at most 366. 0 leaves the setting
	// as it is (AheadDaysDefault for a new layout).
	AheadDays int
}

// AheadDaysDefault is DailyConfig.AheadDays's default.
const AheadDaysDefault = 3

// Errors of the daily layout, returned wrapped by claims. None wraps the
// PostgreSQL error, so that retry.Classify does not take a missing
// partition for bad data.
var (
	// ErrNoPartition means a claim's day has no partition yet: run
	// MaintainPartitions (the consumer's runner does, every PurgeInterval)
	// or check that the producer's clock is not far ahead. Retrying helps
	// once the partition exists.
	ErrNoPartition = errors.New("dedup: no daily partition for the message's day")
	// ErrPartitionDropped means a claim's day was dropped by retention
	// (before Layout.DroppedBefore): its record, if it had one, is gone, so
	// the message can no longer be deduplicated. Retrying cannot help.
	ErrPartitionDropped = errors.New("dedup: the message's daily partition was dropped by retention")
	// ErrLayoutChanged means a claim was refused by the flat table's guard:
	// the store had read the layout before EnableDaily changed it (it reads
	// it again for its next claim), or the switch is still in progress.
	// Roll back and run the transaction again (later, while a switch is in
	// progress: the consumer's runner waits it out with backoff).
	ErrLayoutChanged = errors.New("dedup: the dedup layout changed; run the transaction again")
	// ErrLayoutUnknown means a queued claim of a UUIDv7 ID needs the
	// layout, which this store has not read yet: call Store.Layout first.
	ErrLayoutUnknown = errors.New("dedup: layout not read yet (call Store.Layout)")
)

// dailyNames are the daily layout's objects, quoted where SQL takes them.
type dailyNames struct {
	table     string // the partitioned table, qualified and quoted
	rawTable  string // its name, unquoted
	layout    string // the layout row's table, qualified and quoted
	fromCheck string // the flat table's CHECK added by EnableDaily, unquoted
	schema    string // unquoted
	processed string // the flat table, unquoted
}

func newDailyNames(mc migrate.Tables) dailyNames {
	p := mc.ProcessedMessages
	return dailyNames{
		table:     pgx.Identifier{mc.Schema, migrate.DerivedName(p, "_daily")}.Sanitize(),
		rawTable:  migrate.DerivedName(p, "_daily"),
		layout:    pgx.Identifier{mc.Schema, migrate.DerivedName(p, "_layout")}.Sanitize(),
		fromCheck: migrate.DerivedName(p, "_daily_from"),
		schema:    mc.Schema,
		processed: p,
	}
}

// partitionName is the unquoted name of day's partition.
func (n dailyNames) partitionName(day time.Time) string {
	return migrate.DerivedName(n.processed, "_daily_"+day.Format("20060102"))
}

// uuid7Day returns the UTC day of a UUIDv7's timestamp (RFC 9562: version
// 7, variant 10, the first 48 bits milliseconds since the Unix epoch);
// false for any other UUID. It decides a claim's partition: one ID, one
// day, on every delivery.
func uuid7Day(u pgtype.UUID) (time.Time, bool) {
	b := u.Bytes
	if !u.Valid || b[6]>>4 != 7 || b[8]>>6 != 2 {
		return time.Time{}, false
	}
	ms := int64(b[0])<<40 | int64(b[1])<<32 | int64(b[2])<<24 | int64(b[3])<<16 | int64(b[4])<<8 | int64(b[5])
	t := time.UnixMilli(ms).UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC), true
}

// layoutState is what a store knows of its schema's layout. stale: a
// claim found it out of date; Layout reads it again, while queued claims
// (which cannot read) still route by it and meet the flat table's guard.
type layoutState struct {
	Layout
	stale bool
}

// cachedLayout returns the schema's layout, reading it through db the
// first time and after a claim found it out of date; otherwise what was
// read last. Claims route by it: the consumer's runner makes it known
// before each transaction (dedupq.Queuer.Layout, which bounds the read),
// since queued claims of UUIDv7 IDs need it and cannot read it.
func (s *Store) cachedLayout(ctx context.Context, db DBTX) (Layout, error) {
	if l := s.layout.Load(); l != nil && !l.stale {
		return l.Layout, nil
	}
	return s.Layout(ctx, db)
}

// Layout reads the schema's dedup layout through db now, and remembers it
// for the store's claims: monitoring and tools that must see a switch made
// by another process use it.
func (s *Store) Layout(ctx context.Context, db DBTX) (Layout, error) {
	l, err := s.readLayout(ctx, db)
	if err != nil {
		return Layout{}, err
	}
	s.layout.Store(&layoutState{Layout: l})
	return l, nil
}

// readLayout reads the layout row.
func (s *Store) readLayout(ctx context.Context, db DBTX) (Layout, error) {
	if db == nil {
		return Layout{}, errors.New("dedup: layout: nil db")
	}
	var (
		from, dropped pgtype.Date
		l             Layout
		keep          *int32
		ahead         int32
	)
	err := db.QueryRow(ctx, s.sql.readLayout).Scan(&from, &l.Ready, &keep, &ahead, &dropped)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Layout{}, nil
	case err != nil:
		return Layout{}, fail("layout", err)
	}
	if from.Valid {
		l.DailyFrom = from.Time
	}
	if dropped.Valid {
		l.DroppedBefore = dropped.Time
	}
	if keep != nil {
		l.KeepDays = int(*keep)
	}
	l.AheadDays = int(ahead)
	return l, nil
}

// markStale makes Layout read the layout again; queued claims keep routing
// by the last one read.
func (s *Store) markStale() {
	if l := s.layout.Load(); l != nil {
		s.layout.Store(&layoutState{Layout: l.Layout, stale: true})
	}
}

// route returns where id is stored. A UUIDv7 needs the layout: read
// through db when not known yet or found out of date; queued claims (db
// nil) route by the last layout read, and fail with ErrLayoutUnknown before
// any was.
func (s *Store) route(ctx context.Context, db DBTX, id string) (storedID, error) {
	k := storedID{text: id, uuid: compactID(id)}
	if !k.uuid.Valid {
		return k, nil
	}
	d, ok := uuid7Day(k.uuid)
	if !ok {
		return k, nil
	}
	var l Layout
	switch st := s.layout.Load(); {
	case db != nil:
		var err error
		if l, err = s.cachedLayout(ctx, db); err != nil {
			return k, err
		}
	case st == nil:
		return k, ErrLayoutUnknown
	default:
		l = st.Layout
	}
	if l.Daily() && !d.Before(l.DailyFrom) {
		k.daily, k.day = true, d
	}
	return k, nil
}

// claimError wraps a claim's error, recognising what the daily layout
// adds: a missing partition (day is the claim's day when one claim was
// made, zero for a batch) and a claim the flat table's guard refused.
func (s *Store) claimError(op string, err error, day time.Time) error {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "23514" {
		return fail(op, err)
	}
	switch {
	case pg.ConstraintName == s.daily.fromCheck:
		s.markStale()
		return fmt.Errorf("dedup: %s: %w (%v)", op, ErrLayoutChanged, pg)
	case pg.Routine == "ExecFindPartition" || strings.HasPrefix(pg.Message, "no partition of relation"):
		// The watermark tells a dropped day from one not made yet; the
		// layout is read again for the next claim, to know the latest.
		l := s.layout.Load()
		s.markStale()
		if !day.IsZero() && l != nil && !l.DroppedBefore.IsZero() && day.Before(l.DroppedBefore) {
			return fmt.Errorf("dedup: %s: %w: day %s, before %s (%v)", op, ErrPartitionDropped,
				day.Format(time.DateOnly), l.DroppedBefore.Format(time.DateOnly), pg)
		}
		if day.IsZero() {
			return fmt.Errorf("dedup: %s: %w (%v)", op, ErrNoPartition, pg)
		}
		return fmt.Errorf("dedup: %s: %w: day %s (%v)", op, ErrNoPartition, day.Format(time.DateOnly), pg)
	}
	return fail(op, err)
}

// Partition is one day of the daily table.
type Partition struct {
	Day  time.Time // UTC midnight
	Name string    // the partition's table, unquoted, in the store's schema
}

// Partitions lists the daily table's partitions that idemkit created,
// ascending by day.
func (s *Store) Partitions(ctx context.Context, db DBTX) ([]Partition, error) {
	all, err := s.dayTables(ctx, db)
	if err != nil {
		return nil, err
	}
	var out []Partition
	for _, t := range all {
		if t.attached {
			out = append(out, t.Partition)
		}
	}
	return out, nil
}

// dayTable is a table named as one of the daily table's partitions, and
// whether it is attached (pending: a detach not finished).
type dayTable struct {
	Partition
	attached, pending bool
}

// dayTables lists the tables of the store's schema named as its daily
// partitions, attached or not (a table left detached by an interrupted
// drop), ascending by day.
func (s *Store) dayTables(ctx context.Context, db DBTX) ([]dayTable, error) {
	if db == nil {
		return nil, errors.New("dedup: partitions: nil db")
	}
	prefix := strings.TrimSuffix(s.daily.partitionName(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)), "20000101")
	rows, err := db.Query(ctx, `SELECT c.relname, i.inhrelid IS NOT NULL, coalesce(i.inhdetachpending, false)
	FROM pg_class AS c
	JOIN pg_namespace AS n ON n.oid = c.relnamespace
	LEFT JOIN pg_inherits AS i ON i.inhrelid = c.oid AND i.inhparent = to_regclass($3)
	WHERE n.nspname = $1 AND c.relkind = 'r' AND left(c.relname, length($2)) = $2`, s.daily.schema, prefix, s.daily.table)
	if err != nil {
		return nil, fail("partitions", err)
	}
	var out []dayTable
	var name string
	var attached, pending bool
	_, err = pgx.ForEachRow(rows, []any{&name, &attached, &pending}, func() error {
		if len(name) < 8 {
			return nil
		}
		day, err := time.Parse("20060102", name[len(name)-8:])
		if err != nil || s.daily.partitionName(day) != name {
			return nil // not one of ours
		}
		out = append(out, dayTable{Partition{Day: day, Name: name}, attached, pending})
		return nil
	})
	if err != nil {
		return nil, fail("partitions", err)
	}
	slices.SortFunc(out, func(a, b dayTable) int { return a.Day.Compare(b.Day) })
	return out, nil
}

// PartitionChanges is what MaintainPartitions did.
type PartitionChanges struct {
	Created []time.Time // days whose partition was created
	Dropped []time.Time // days whose partition was dropped
}

// Lock waits of the daily layout's DDL. Each statement waits at most that
// long for its lock, so that the claims queued behind it wait no longer;
// a statement that times out is tried again a moment later (EnableDaily)
// or at the next run (MaintainPartitions).
const (
	// partitionLockTimeout: ATTACH and DETACH … CONCURRENTLY take locks
	// claims do not wait for.
	partitionLockTimeout = "2s"
	// checkLockTimeout: the flat table's CHECK needs ACCESS EXCLUSIVE,
	// which every claim waits behind while it is requested.
	checkLockTimeout = "300ms"
	// checkAttempts: how many times EnableDaily asks for it (a second
	// apart).
	checkAttempts = 120
)

// MaintainPartitions keeps the daily table's partitions: it creates the
// missing ones from the oldest day kept (never before DroppedBefore) to
// AheadDays ahead of today (the database's clock, UTC), and drops those
// older than KeepDays, raising the watermark DroppedBefore first, so that
// a dropped day is never created again. It also finishes a switch that
// EnableDaily left unfinished, and removes tables an interrupted drop left
// detached. Partitions are created empty and attached, and detached
// concurrently before they are dropped, so claims keep flowing. Concurrent
// calls (one per runner) are serialized. With a flat layout it does
// nothing.
func (s *Store) MaintainPartitions(ctx context.Context, db *pgxpool.Pool) (PartitionChanges, error) {
	var ch PartitionChanges
	if db == nil {
		return ch, errors.New("dedup: maintain partitions: nil pool")
	}
	l, err := s.readLayout(ctx, db)
	if err != nil || l.DailyFrom.IsZero() {
		return ch, err // flat: nothing to take a lock for
	}
	err = s.locked(ctx, db, func(conn *pgxpool.Conn) error {
		l, err := s.readLayout(ctx, conn) // again, under the lock
		if err != nil {
			return err
		}
		if !l.DailyFrom.IsZero() && !l.Ready {
			if l, err = s.finishSwitch(ctx, conn, l); err != nil {
				return err
			}
		}
		if !l.Daily() {
			return nil
		}
		ch, err = s.maintain(ctx, conn, l)
		return err
	})
	return ch, err
}

// locked runs f on a connection that holds the daily layout's session
// advisory lock: maintenance and switches, one at a time per daily table.
func (s *Store) locked(ctx context.Context, db *pgxpool.Pool, f func(conn *pgxpool.Conn) error) error {
	conn, err := db.Acquire(ctx)
	if err != nil {
		return fail("daily partitions", err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, s.lockKey()); err != nil {
		return fail("daily partitions", err)
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, s.lockKey()); err != nil {
			_ = conn.Conn().Close(context.WithoutCancel(ctx)) // the lock goes with the session
		}
	}()
	return f(conn)
}

// maintain is MaintainPartitions under the lock, with the layout read
// under it.
func (s *Store) maintain(ctx context.Context, conn *pgxpool.Conn, l Layout) (PartitionChanges, error) {
	var ch PartitionChanges
	var now time.Time
	if err := conn.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&now); err != nil {
		return ch, fail("maintain partitions", err)
	}
	now = time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	// The watermark first: once it is committed, no maintainer creates a
	// day below it again, whatever its clock read.
	if l.KeepDays > 0 {
		if keepFrom := now.AddDate(0, 0, -l.KeepDays); keepFrom.After(l.DroppedBefore) {
			if _, err := conn.Exec(ctx, `UPDATE `+s.daily.layout+` SET dropped_before = $1, changed_at = now()
				WHERE dropped_before IS NULL OR dropped_before < $1`, keepFrom); err != nil {
				return ch, fail("maintain partitions", err)
			}
			l.DroppedBefore = keepFrom
		}
	}
	tables, err := s.dayTables(ctx, conn)
	if err != nil {
		return ch, err
	}
	exists := make(map[time.Time]bool, len(tables))
	for _, t := range tables {
		exists[t.Day] = t.attached
	}
	first := l.DailyFrom
	if l.DroppedBefore.After(first) {
		first = l.DroppedBefore
	}
	last := now.AddDate(0, 0, max(l.AheadDays, 1))
	for day := first; !day.After(last); day = day.AddDate(0, 0, 1) {
		if exists[day] {
			continue
		}
		if err := s.createPartition(ctx, conn, day); err != nil {
			return ch, err
		}
		ch.Created = append(ch.Created, day)
	}
	// Drops: below the watermark, attached or left detached; a detach
	// pending anywhere is finished first (PostgreSQL detaches concurrently
	// one partition at a time).
	for _, t := range tables {
		if t.pending {
			if err := s.dropPartition(ctx, conn, t); err != nil {
				return ch, err
			}
			if t.Day.Before(l.DroppedBefore) {
				ch.Dropped = append(ch.Dropped, t.Day)
			}
		}
	}
	for _, t := range tables {
		if t.pending || !t.Day.Before(l.DroppedBefore) {
			continue
		}
		if err := s.dropPartition(ctx, conn, t); err != nil {
			return ch, err
		}
		if t.attached {
			ch.Dropped = append(ch.Dropped, t.Day)
		}
	}
	slices.SortFunc(ch.Dropped, func(a, b time.Time) int { return a.Compare(b) })
	s.layout.Store(&layoutState{Layout: l})
	return ch, nil
}

// lockKey serializes partition DDL per daily table.
func (s *Store) lockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("idemkit.dedup.daily:" + s.daily.table))
	return int64(h.Sum64())
}

// createPartition creates day's partition empty, then attaches it: ATTACH
// takes a lock on the daily table that claims do not wait for (CREATE
// TABLE … PARTITION OF would take one they do).
func (s *Store) createPartition(ctx context.Context, conn *pgxpool.Conn, day time.Time) error {
	name := pgx.Identifier{s.daily.schema, s.daily.partitionName(day)}.Sanitize()
	from, to := dateLiteral(day), dateLiteral(day.AddDate(0, 0, 1))
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+partitionLockTimeout+`'`); err != nil {
			return err
		}
		// The CHECK on the bounds lets ATTACH skip scanning the table; it
		// goes after, as every CHECK is prepared again at each insert.
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+name+` (LIKE `+s.daily.table+` INCLUDING DEFAULTS INCLUDING CONSTRAINTS,
			CONSTRAINT idemkit_day_bounds CHECK (day >= `+from+` AND day < `+to+`))`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `ALTER TABLE `+s.daily.table+` ATTACH PARTITION `+name+` FOR VALUES FROM (`+from+`) TO (`+to+`)`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `ALTER TABLE `+name+` DROP CONSTRAINT IF EXISTS idemkit_day_bounds`)
		return err
	})
	if err != nil {
		return fail("create partition "+day.Format(time.DateOnly), err)
	}
	return nil
}

// dropPartition detaches t concurrently if it is attached (claims keep
// flowing), finishes a detach left pending, then drops the table.
func (s *Store) dropPartition(ctx context.Context, conn *pgxpool.Conn, t dayTable) error {
	name := pgx.Identifier{s.daily.schema, t.Name}.Sanitize()
	what := "drop partition " + t.Day.Format(time.DateOnly)
	// DETACH … CONCURRENTLY cannot run in a transaction block: the
	// setting is the session's, for these statements.
	if _, err := conn.Exec(ctx, `SET lock_timeout = '`+partitionLockTimeout+`'`); err != nil {
		return fail(what, err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `RESET lock_timeout`) }()
	switch {
	case t.pending:
		if _, err := conn.Exec(ctx, `ALTER TABLE `+s.daily.table+` DETACH PARTITION `+name+` FINALIZE`); err != nil {
			return fail(what, err)
		}
	case t.attached:
		if _, err := conn.Exec(ctx, `ALTER TABLE `+s.daily.table+` DETACH PARTITION `+name+` CONCURRENTLY`); err != nil {
			return fail(what, err)
		}
	}
	if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS `+name); err != nil {
		return fail(what, err)
	}
	return nil
}

// dateLiteral is day as an SQL date literal: DDL takes no parameters, and
// a formatted date cannot carry anything else.
func dateLiteral(day time.Time) string { return "DATE '" + day.Format(time.DateOnly) + "'" }

// uuid7Bound is the least UUID whose first 48 bits are day's first
// millisecond: UUIDs compare bytewise, so a UUIDv7 is dated day or later
// exactly when it is not below it.
func uuid7Bound(day time.Time) string {
	ms := day.UnixMilli()
	return fmt.Sprintf("%08x-%04x-0000-0000-000000000000", ms>>16, ms&0xffff)
}

// uuid7From is an SQL condition on column (a uuid): a UUIDv7 dated day or
// later. Built-in operators only: a function would be planned again at
// every insert the CHECK guards, which costs more than the insert.
func uuid7From(column string, day time.Time) string {
	return `(` + column + ` >= '` + uuid7Bound(day) + `' AND get_byte(uuid_send(` + column + `), 6) >> 4 = 7 AND get_byte(uuid_send(` + column + `), 8) >> 6 = 2)`
}

// ErrDailyRefused means the switch to the daily layout found claims in the
// flat table that the daily table would have to hold (UUIDv7 IDs dated
// DailyFrom or later, from producers whose clocks run ahead); it was
// undone, nothing changed. Try again once they are purged, or later.
var ErrDailyRefused = errors.New("dedup: the daily layout cannot be enabled yet")

// EnableDaily switches the schema to the daily layout, or, when it is
// already daily (or switching), changes the settings cfg gives. UUIDv7 IDs
// dated from the day after tomorrow (UTC, the database's clock) on are
// then stored in the daily table; every other ID, and UUIDv7 IDs dated
// before, stay in the flat table, where Purge keeps removing them. It
// returns the layout now in force.
//
// The switch is made safe for processes that run meanwhile, in steps that
// can each be run again after a failure: a CHECK on the flat table refuses
// its UUIDv7 IDs from that day on (added NOT VALID; it needs a lock every
// claim waits behind while it is requested, so it asks for at most 300 ms
// at a time, a second apart, for up to two minutes); the CHECK is
// validated against the rows already there (a scan that blocks no claim);
// the first partitions are created and the layout marked ready. A store
// that read the flat layout before and claims such an ID gets
// ErrLayoutChanged and reads the layout again. An EnableDaily interrupted
// after its first step is finished by the next MaintainPartitions (every
// runner's, each PurgeInterval); meanwhile, claims dated DailyFrom or later
// are refused, which is why DailyFrom is two days ahead. There is no way
// back to the flat layout once the switch is done.
func (s *Store) EnableDaily(ctx context.Context, db *pgxpool.Pool, cfg DailyConfig) (Layout, error) {
	if db == nil {
		return Layout{}, errors.New("dedup: enable daily: nil pool")
	}
	switch {
	case cfg.KeepDays < -1:
		return Layout{}, fmt.Errorf("dedup: enable daily: %w", invalid("KeepDays %d is below -1", cfg.KeepDays))
	case cfg.AheadDays < 0 || cfg.AheadDays > 366:
		return Layout{}, fmt.Errorf("dedup: enable daily: %w", invalid("AheadDays %d is not within 0 to 366", cfg.AheadDays))
	}
	var l Layout
	err := s.locked(ctx, db, func(conn *pgxpool.Conn) error {
		var err error
		if l, err = s.readLayout(ctx, conn); err != nil {
			return err
		}
		if l.DailyFrom.IsZero() {
			if err := s.addFromCheck(ctx, conn, cfg); err != nil {
				return err
			}
		} else if err := s.setDaily(ctx, conn, cfg); err != nil {
			return err
		}
		if l, err = s.readLayout(ctx, conn); err != nil {
			return err
		}
		if !l.Ready {
			if _, err = s.finishSwitch(ctx, conn, l); err != nil {
				return err
			}
		}
		l, err = s.readLayout(ctx, conn) // as it is now
		return err
	})
	if err != nil {
		return Layout{}, fmt.Errorf("dedup: enable daily: %w", err)
	}
	s.layout.Store(&layoutState{Layout: l})
	return l, nil
}

// setDaily changes the settings cfg gives (see DailyConfig).
func (s *Store) setDaily(ctx context.Context, conn *pgxpool.Conn, cfg DailyConfig) error {
	var keep *int
	if cfg.KeepDays > 0 {
		keep = &cfg.KeepDays
	}
	_, err := conn.Exec(ctx, `UPDATE `+s.daily.layout+` SET
		keep_days = CASE WHEN $1::int = 0 THEN keep_days ELSE $2::int END,
		ahead_days = CASE WHEN $3::int = 0 THEN ahead_days ELSE $3::int END, changed_at = now()`,
		cfg.KeepDays, keep, cfg.AheadDays)
	if err != nil {
		return fail("enable daily", err)
	}
	return nil
}

// addFromCheck is the switch's first step: the flat table's CHECK and the
// layout's first day, in one transaction.
func (s *Store) addFromCheck(ctx context.Context, conn *pgxpool.Conn, cfg DailyConfig) error {
	flat := pgx.Identifier{s.daily.schema, s.daily.processed}.Sanitize()
	var keep *int
	if cfg.KeepDays > 0 {
		keep = &cfg.KeepDays
	}
	ahead := cmp.Or(cfg.AheadDays, AheadDaysDefault)
	err := s.retryLock(ctx, func() error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var from time.Time
			if err := tx.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date + 2`).Scan(&from); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+checkLockTimeout+`'`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `ALTER TABLE `+flat+` ADD CONSTRAINT `+pgx.Identifier{s.daily.fromCheck}.Sanitize()+
				` CHECK (message_uuid IS NULL OR NOT `+uuid7From("message_uuid", from)+`) NOT VALID`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE `+s.daily.layout+` SET daily_from = $1, daily_ready = false, keep_days = $2,
				ahead_days = $3, dropped_before = NULL, changed_at = now()`, from, keep, ahead)
			return err
		})
	})
	if err != nil {
		return fail("enable daily", err)
	}
	return nil
}

// retryLock runs f again while it fails for a lock not granted in time
// (lock_not_available: claims in flight), a second apart, checkAttempts
// times at most.
func (s *Store) retryLock(ctx context.Context, f func() error) error {
	var err error
	for attempt := 0; attempt < checkAttempts; attempt++ {
		err = f()
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != "55P03" {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return err
}

// finishSwitch is the switch's last steps, l being pending: no row stored
// before may belong to the daily table (else the switch is undone,
// ErrDailyRefused), then partitions, then ready. It returns the layout in
// force after it.
func (s *Store) finishSwitch(ctx context.Context, conn *pgxpool.Conn, l Layout) (Layout, error) {
	flat := pgx.Identifier{s.daily.schema, s.daily.processed}.Sanitize()
	refused := func() (Layout, error) {
		if err := s.undoFromCheck(ctx, conn); err != nil {
			return Layout{}, err
		}
		return Layout{}, fmt.Errorf("%w: the flat table holds UUIDv7 IDs dated %s or later (a producer's clock ahead?); the switch was undone",
			ErrDailyRefused, l.DailyFrom.Format(time.DateOnly))
	}
	if _, err := conn.Exec(ctx, `ALTER TABLE `+flat+` VALIDATE CONSTRAINT `+pgx.Identifier{s.daily.fromCheck}.Sanitize()); err != nil {
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != "23514" {
			return Layout{}, fail("enable daily: validate", err)
		}
		return refused()
	}
	l.Ready = true
	if _, err := s.maintain(ctx, conn, l); err != nil {
		return Layout{}, err
	}
	if _, err := conn.Exec(ctx, `UPDATE `+s.daily.layout+` SET daily_ready = true, changed_at = now()`); err != nil {
		return Layout{}, fail("enable daily", err)
	}
	return l, nil
}

// undoFromCheck undoes addFromCheck.
func (s *Store) undoFromCheck(ctx context.Context, conn *pgxpool.Conn) error {
	flat := pgx.Identifier{s.daily.schema, s.daily.processed}.Sanitize()
	err := s.retryLock(ctx, func() error {
		return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+checkLockTimeout+`'`); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `ALTER TABLE `+flat+` DROP CONSTRAINT IF EXISTS `+pgx.Identifier{s.daily.fromCheck}.Sanitize()); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `UPDATE `+s.daily.layout+` SET daily_from = NULL, daily_ready = false, changed_at = now()`)
			return err
		})
	})
	if err != nil {
		return fail("enable daily: undo", err)
	}
	return nil
}
