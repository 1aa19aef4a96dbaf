package dedup

import (
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
	// Ready is false while EnableDaily is still switching: claims then stay
	// in the flat table (and those the switch moves fail and are retried).
	Ready bool
	// KeepDays is how many days of partitions MaintainPartitions keeps
	// behind today; 0 means it drops none.
	KeepDays int
	// AheadDays is how many days of partitions MaintainPartitions creates
	// ahead of today.
	AheadDays int
}

// Daily reports whether UUIDv7 IDs from DailyFrom on are stored in the
// daily table.
func (l Layout) Daily() bool { return l.Ready && !l.DailyFrom.IsZero() }

// DailyConfig configures the daily layout (EnableDaily).
type DailyConfig struct {
	// KeepDays is how many whole days of partitions behind today
	// MaintainPartitions keeps: a partition whose every ID is KeepDays or
	// more days old is dropped. 0 keeps every partition (never drops).
	// Choose it as the retention you would give Store.Purge: an ID whose
	// partition is dropped can no longer be deduplicated (ErrPartitionDropped).
	KeepDays int
	// AheadDays is how many days of partitions are created ahead of today,
	// so that claims never wait for one. 0 means AheadDaysDefault; at most
	// 366.
	AheadDays int
}

// AheadDaysDefault is DailyConfig.AheadDays's default.
const AheadDaysDefault = 3

// Errors of the daily layout. Both are returned wrapped by claims; neither
// wraps the PostgreSQL error, so that retry.Classify does not take a
// missing partition for bad data.
var (
	// ErrNoPartition means a claim's day has no partition yet: run
	// MaintainPartitions (the consumer's runner does, every PurgeInterval)
	// or check that the producer's clock is not far ahead. Retrying helps
	// once the partition exists.
	ErrNoPartition = errors.New("dedup: no daily partition for the message's day")
	// ErrPartitionDropped means a claim's day is older than the partitions
	// kept (DailyConfig.KeepDays): its record, if it had one, is gone, so
	// the message can no longer be deduplicated. Retrying cannot help.
	ErrPartitionDropped = errors.New("dedup: the message's daily partition was dropped by retention")
	// ErrLayoutChanged means a claim was made under a layout this store had
	// read before EnableDaily changed it; the store reads the layout again
	// on its next claim, so retrying the transaction helps.
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

func newDailyNames(mc migrate.Config) dailyNames {
	p := mc.Tables.ProcessedMessages
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

// layoutState is what a store knows of its schema's layout.
type layoutState struct {
	Layout
}

// Layout returns the schema's layout, reading it through db the first time
// (and after a claim found it changed); later calls return what was read.
// A schema without the layout table (migration 15) is flat. The consumer's
// runner calls it before its first claim; call it yourself before queueing
// claims (QueueClaimWithPosition, QueueClaimBatch) of UUIDv7 IDs, which
// need it and cannot read it.
func (s *Store) Layout(ctx context.Context, db DBTX) (Layout, error) {
	if l := s.layout.Load(); l != nil {
		return l.Layout, nil
	}
	l, err := s.readLayout(ctx, db)
	if err != nil {
		return Layout{}, err
	}
	s.layout.Store(&layoutState{l})
	return l, nil
}

// readLayout reads the layout row; a missing table means flat.
func (s *Store) readLayout(ctx context.Context, db DBTX) (Layout, error) {
	if db == nil {
		return Layout{}, errors.New("dedup: layout: nil db")
	}
	var (
		from  pgtype.Date
		l     Layout
		keep  *int32
		ahead int32
	)
	// Looked up first: a missing table must not fail (and so abort) the
	// caller's transaction.
	var exists bool
	if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.daily.layout).Scan(&exists); err != nil {
		return Layout{}, fail("layout", err)
	}
	if !exists {
		return Layout{}, nil // before migration 15: flat
	}
	err := db.QueryRow(ctx, `SELECT daily_from, daily_ready, keep_days, ahead_days FROM `+s.daily.layout).
		Scan(&from, &l.Ready, &keep, &ahead)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Layout{}, nil
	case err != nil:
		return Layout{}, fail("layout", err)
	}
	if from.Valid {
		l.DailyFrom = from.Time
	}
	if keep != nil {
		l.KeepDays = int(*keep)
	}
	l.AheadDays = int(ahead)
	return l, nil
}

// forgetLayout makes the next claim read the layout again.
func (s *Store) forgetLayout() { s.layout.Store(nil) }

// route returns where c's ID is stored: keyText, keyUUID or keyDaily, its
// uuid and (keyDaily) its day. A UUIDv7 needs the layout: read through db
// when not known yet; db nil (queued claims) then fails with
// ErrLayoutUnknown.
func (s *Store) route(ctx context.Context, db DBTX, id string) (kind int, u pgtype.UUID, day time.Time, err error) {
	u = compactID(id)
	if !u.Valid {
		return keyText, u, day, nil
	}
	d, ok := uuid7Day(u)
	if !ok {
		return keyUUID, u, day, nil
	}
	l := s.layout.Load()
	if l == nil {
		if db == nil {
			return 0, u, day, ErrLayoutUnknown
		}
		layout, err := s.Layout(ctx, db)
		if err != nil {
			return 0, u, day, err
		}
		l = &layoutState{layout}
	}
	if l.Daily() && !d.Before(l.DailyFrom) {
		return keyDaily, u, d, nil
	}
	return keyUUID, u, day, nil
}

// claimError wraps a claim's error, recognising what the daily layout
// adds: a missing partition (day is the claim's day when one claim was
// made, zero for a batch) and a claim the layout moved since it was read.
func (s *Store) claimError(op string, err error, day time.Time) error {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "23514" {
		return fail(op, err)
	}
	switch {
	case pg.ConstraintName == s.daily.fromCheck:
		s.forgetLayout()
		return fmt.Errorf("dedup: %s: %w (%v)", op, ErrLayoutChanged, pg)
	case strings.HasPrefix(pg.Message, "no partition of relation"):
		if l := s.layout.Load(); !day.IsZero() && l != nil && l.KeepDays > 0 &&
			day.Before(today().AddDate(0, 0, -l.KeepDays)) {
			return fmt.Errorf("dedup: %s: %w: day %s is older than the %d days kept (%v)", op, ErrPartitionDropped,
				day.Format(time.DateOnly), l.KeepDays, pg)
		}
		if day.IsZero() {
			return fmt.Errorf("dedup: %s: %w (%v)", op, ErrNoPartition, pg)
		}
		return fmt.Errorf("dedup: %s: %w: day %s (%v)", op, ErrNoPartition, day.Format(time.DateOnly), pg)
	}
	return fail(op, err)
}

// today is the current UTC day by this host's clock (only used to tell a
// dropped partition from one not created yet).
func today() time.Time {
	t := time.Now().UTC()
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// Partition is one day of the daily table.
type Partition struct {
	Day  time.Time // UTC midnight
	Name string    // the partition's table, unquoted, in the store's schema
}

// Partitions lists the daily table's partitions that idemkit created,
// ascending by day.
func (s *Store) Partitions(ctx context.Context, db DBTX) ([]Partition, error) {
	if db == nil {
		return nil, errors.New("dedup: partitions: nil db")
	}
	rows, err := db.Query(ctx, `SELECT c.relname FROM pg_inherits AS i
	JOIN pg_class AS c ON c.oid = i.inhrelid
	WHERE i.inhparent = to_regclass($1)`, s.daily.table)
	if err != nil {
		return nil, fail("partitions", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fail("partitions", err)
	}
	var out []Partition
	for _, name := range names {
		if len(name) < 8 {
			continue
		}
		day, err := time.Parse("20060102", name[len(name)-8:])
		if err != nil || s.daily.partitionName(day) != name {
			continue // not one of ours
		}
		out = append(out, Partition{Day: day, Name: name})
	}
	slices.SortFunc(out, func(a, b Partition) int { return a.Day.Compare(b.Day) })
	return out, nil
}

// PartitionChanges is what MaintainPartitions did.
type PartitionChanges struct {
	Created []time.Time // days whose partition was created
	Dropped []time.Time // days whose partition was dropped
}

// lockTimeout bounds how long partition DDL waits for a lock: the claims
// it would block meanwhile wait at most that long. A maintenance that
// times out tries again at its next run.
const lockTimeout = "2s"

// MaintainPartitions creates the daily table's missing partitions, from
// the oldest day kept (or DailyFrom) to AheadDays ahead of today (by the
// database's clock, UTC), and drops those older than KeepDays. Each
// partition is created empty and attached, and detached concurrently
// before it is dropped, so claims keep flowing; a lock not granted within
// a short timeout leaves the work to the next run. Concurrent calls (one
// per runner) are serialized. With a flat layout it does nothing.
func (s *Store) MaintainPartitions(ctx context.Context, db *pgxpool.Pool) (PartitionChanges, error) {
	var ch PartitionChanges
	if db == nil {
		return ch, errors.New("dedup: maintain partitions: nil pool")
	}
	l, err := s.readLayout(ctx, db)
	if err != nil {
		return ch, err
	}
	if !l.Daily() {
		return ch, nil
	}
	return s.maintain(ctx, db, l)
}

func (s *Store) maintain(ctx context.Context, db *pgxpool.Pool, l Layout) (PartitionChanges, error) {
	var ch PartitionChanges
	var now time.Time
	if err := db.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date`).Scan(&now); err != nil {
		return ch, fail("maintain partitions", err)
	}
	now = time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	have, err := s.Partitions(ctx, db)
	if err != nil {
		return ch, err
	}
	exists := make(map[time.Time]bool, len(have))
	for _, p := range have {
		exists[p.Day] = true
	}
	first := l.DailyFrom
	var dropBefore time.Time
	if l.KeepDays > 0 {
		dropBefore = now.AddDate(0, 0, -l.KeepDays)
		if first.Before(dropBefore) {
			first = dropBefore
		}
	}
	last := now.AddDate(0, 0, max(l.AheadDays, 1))
	for day := first; !day.After(last); day = day.AddDate(0, 0, 1) {
		if exists[day] {
			continue
		}
		if err := s.createPartition(ctx, db, day); err != nil {
			return ch, err
		}
		ch.Created = append(ch.Created, day)
	}
	if dropBefore.IsZero() {
		return ch, nil
	}
	for _, p := range have {
		if !p.Day.Before(dropBefore) {
			break
		}
		if err := s.dropPartition(ctx, db, p); err != nil {
			return ch, err
		}
		ch.Dropped = append(ch.Dropped, p.Day)
	}
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
func (s *Store) createPartition(ctx context.Context, db *pgxpool.Pool, day time.Time) error {
	name := pgx.Identifier{s.daily.schema, s.daily.partitionName(day)}.Sanitize()
	from, to := dateLiteral(day), dateLiteral(day.AddDate(0, 0, 1))
	err := s.withLockRetry(ctx, db, func(tx pgx.Tx) error {
		var attached bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_inherits
			WHERE inhrelid = to_regclass($1) AND inhparent = to_regclass($2))`, name, s.daily.table).Scan(&attached); err != nil {
			return err
		}
		if attached {
			return nil // a concurrent maintainer made it
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

// dropPartition detaches p concurrently (claims keep flowing), then drops
// it. A detach interrupted before is finished first.
func (s *Store) dropPartition(ctx context.Context, db *pgxpool.Pool, p Partition) error {
	name := pgx.Identifier{s.daily.schema, p.Name}.Sanitize()
	conn, err := db.Acquire(ctx)
	if err != nil {
		return fail("drop partition "+p.Day.Format(time.DateOnly), err)
	}
	defer conn.Release()
	// Advisory session lock: DETACH CONCURRENTLY cannot run in a
	// transaction block.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, s.lockKey()); err != nil {
		return fail("drop partition "+p.Day.Format(time.DateOnly), err)
	}
	defer func() {
		if _, err := conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, s.lockKey()); err != nil {
			conn.Conn().Close(context.WithoutCancel(ctx)) // the lock goes with the session
		}
	}()
	if _, err := conn.Exec(ctx, `SET lock_timeout = '`+lockTimeout+`'`); err != nil {
		return fail("drop partition "+p.Day.Format(time.DateOnly), err)
	}
	defer func() { _, _ = conn.Exec(context.WithoutCancel(ctx), `RESET lock_timeout`) }()
	var pending, attached bool
	if err := conn.QueryRow(ctx, `SELECT coalesce(bool_or(inhdetachpending), false), count(*) > 0 FROM pg_inherits
		WHERE inhrelid = to_regclass($1) AND inhparent = to_regclass($2)`, name, s.daily.table).Scan(&pending, &attached); err != nil {
		return fail("drop partition "+p.Day.Format(time.DateOnly), err)
	}
	detach := `ALTER TABLE ` + s.daily.table + ` DETACH PARTITION ` + name + ` CONCURRENTLY`
	if pending {
		detach = `ALTER TABLE ` + s.daily.table + ` DETACH PARTITION ` + name + ` FINALIZE`
	}
	if attached {
		if _, err := conn.Exec(ctx, detach); err != nil {
			return fail("drop partition "+p.Day.Format(time.DateOnly), err)
		}
	}
	if _, err := conn.Exec(ctx, `DROP TABLE IF EXISTS `+name); err != nil {
		return fail("drop partition "+p.Day.Format(time.DateOnly), err)
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

// EnableDaily switches the schema to the daily layout, or, when it is
// already daily, updates its KeepDays and AheadDays. UUIDv7 IDs dated from
// tomorrow (UTC, the database's clock) on are then stored in the daily
// table; every other ID, and UUIDv7 IDs dated before, stay in the flat
// table, where Purge keeps removing them. It returns the layout now in
// force.
//
// The switch is made safe for processes that run meanwhile, in three
// steps, each of which can be run again after a failure: a CHECK on the
// flat table refuses its UUIDv7 IDs from that day on (added NOT VALID:
// waiting at most a few seconds for the claims in flight, retried
// meanwhile); the CHECK is validated against the rows already there (a
// scan that blocks no claim); the first partitions are created and the
// layout marked ready. A store that read the flat layout before and claims
// such an ID gets ErrLayoutChanged and reads the layout again. There is no
// way back but migrating down (migration 15's down copies the daily rows
// into the flat table).
func (s *Store) EnableDaily(ctx context.Context, db *pgxpool.Pool, cfg DailyConfig) (Layout, error) {
	if db == nil {
		return Layout{}, errors.New("dedup: enable daily: nil pool")
	}
	switch {
	case cfg.KeepDays < 0:
		return Layout{}, fmt.Errorf("dedup: enable daily: %w", invalid("KeepDays %d is negative", cfg.KeepDays))
	case cfg.AheadDays < 0 || cfg.AheadDays > 366:
		return Layout{}, fmt.Errorf("dedup: enable daily: %w", invalid("AheadDays %d is not within 0 to 366", cfg.AheadDays))
	}
	ahead := cfg.AheadDays
	if ahead == 0 {
		ahead = AheadDaysDefault
	}
	var keep *int
	if cfg.KeepDays > 0 {
		keep = &cfg.KeepDays
	}
	l, err := s.readLayout(ctx, db)
	if err != nil {
		return Layout{}, fmt.Errorf("dedup: enable daily: %w", err)
	}
	if l.DailyFrom.IsZero() {
		if err := s.addFromCheck(ctx, db, keep, ahead); err != nil {
			return Layout{}, err
		}
	} else if _, err := db.Exec(ctx, `UPDATE `+s.daily.layout+` SET keep_days = $1, ahead_days = $2, changed_at = now()`,
		keep, ahead); err != nil {
		return Layout{}, fail("enable daily", err)
	}
	if l, err = s.readLayout(ctx, db); err != nil {
		return Layout{}, fmt.Errorf("dedup: enable daily: %w", err)
	}
	if l.Daily() {
		s.forgetLayout()
		return l, nil
	}
	// Step 2: no row stored before may belong to the daily table. If one
	// does, step 1 is undone: a pending switch would refuse such IDs for
	// good.
	if _, err := db.Exec(ctx, `ALTER TABLE `+pgx.Identifier{s.daily.schema, s.daily.processed}.Sanitize()+
		` VALIDATE CONSTRAINT `+pgx.Identifier{s.daily.fromCheck}.Sanitize()); err != nil {
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != "23514" {
			return Layout{}, fail("enable daily: validate", err)
		}
		if uerr := s.undoFromCheck(ctx, db); uerr != nil {
			return Layout{}, uerr
		}
		return Layout{}, fmt.Errorf("dedup: enable daily: %w: the flat table holds UUIDv7 IDs dated %s or later (a producer's clock ahead?); nothing changed",
			ErrDailyRefused, l.DailyFrom.Format(time.DateOnly))
	}
	var textRows bool // UUIDs stored as text before migration 14
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+pgx.Identifier{s.daily.schema, s.daily.processed}.Sanitize()+`
		WHERE CASE WHEN message_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$'
			THEN message_id::uuid >= $1::uuid ELSE false END)`, uuid7Bound(l.DailyFrom)).Scan(&textRows); err != nil {
		return Layout{}, fail("enable daily", err)
	}
	if textRows {
		if uerr := s.undoFromCheck(ctx, db); uerr != nil {
			return Layout{}, uerr
		}
		return Layout{}, fmt.Errorf("dedup: enable daily: %w: the flat table holds UUIDv7 IDs (stored as text before migration 14) dated %s or later; nothing changed",
			ErrDailyRefused, l.DailyFrom.Format(time.DateOnly))
	}
	// Step 3: partitions first, then the layout.
	if _, err := s.maintain(ctx, db, Layout{DailyFrom: l.DailyFrom, Ready: true, KeepDays: l.KeepDays, AheadDays: l.AheadDays}); err != nil {
		return Layout{}, fmt.Errorf("dedup: enable daily: %w", err)
	}
	if _, err := db.Exec(ctx, `UPDATE `+s.daily.layout+` SET daily_ready = true, changed_at = now()`); err != nil {
		return Layout{}, fail("enable daily", err)
	}
	s.forgetLayout()
	l.Ready = true
	return l, nil
}

// ErrDailyRefused means EnableDaily found claims in the flat table that
// the daily table would have to hold (UUIDv7 IDs dated from tomorrow on,
// from producers whose clocks run ahead); it changed nothing. Try again
// once they are purged, or later.
var ErrDailyRefused = errors.New("dedup: the daily layout cannot be enabled yet")

// undoFromCheck undoes addFromCheck.
func (s *Store) undoFromCheck(ctx context.Context, db *pgxpool.Pool) error {
	flat := pgx.Identifier{s.daily.schema, s.daily.processed}.Sanitize()
	err := s.withLockRetry(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `ALTER TABLE `+flat+` DROP CONSTRAINT IF EXISTS `+pgx.Identifier{s.daily.fromCheck}.Sanitize()); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+s.daily.layout+` SET daily_from = NULL, daily_ready = false, changed_at = now()`)
		return err
	})
	if err != nil {
		return fail("enable daily: undo", err)
	}
	return nil
}

// withLockRetry runs f in a transaction that holds the partition DDL lock
// and waits at most lockTimeout for each table lock, again while a lock is
// not granted (claims in flight), up to ten times.
func (s *Store) withLockRetry(ctx context.Context, db *pgxpool.Pool, f func(tx pgx.Tx) error) error {
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, s.lockKey()); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '`+lockTimeout+`'`); err != nil {
				return err
			}
			return f(tx)
		})
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != "55P03" { // lock_not_available
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

// addFromCheck is EnableDaily's first step: the flat table's CHECK and the
// layout's first day, in one transaction, waiting for the claims in flight
// a few seconds at a time.
func (s *Store) addFromCheck(ctx context.Context, db *pgxpool.Pool, keep *int, ahead int) error {
	flat := pgx.Identifier{s.daily.schema, s.daily.processed}.Sanitize()
	err := s.withLockRetry(ctx, db, func(tx pgx.Tx) error {
		var from time.Time
		var set bool
		if err := tx.QueryRow(ctx, `SELECT (now() AT TIME ZONE 'UTC')::date + 1, daily_from IS NOT NULL FROM `+s.daily.layout+` FOR UPDATE`).
			Scan(&from, &set); err != nil {
			return err
		}
		if set {
			return nil // a concurrent EnableDaily did it
		}
		if _, err := tx.Exec(ctx, `ALTER TABLE `+flat+` ADD CONSTRAINT `+pgx.Identifier{s.daily.fromCheck}.Sanitize()+
			` CHECK (message_uuid IS NULL OR NOT `+uuid7From("message_uuid", from)+`) NOT VALID`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+s.daily.layout+` SET daily_from = $1, daily_ready = false, keep_days = $2, ahead_days = $3, changed_at = now()`,
			from, keep, ahead)
		return err
	})
	if err != nil {
		return fail("enable daily", err)
	}
	return nil
}
