package migrate

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/outage"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

// lockPrefix keys the advisory lock: hashtext(lockPrefix || schema).
const lockPrefix = "idemkit.migrate:"

// migration is one version: its name and its two templates.
type migration struct {
	version  int
	name     string
	up, down *template.Template
}

// all is every embedded migration, ascending by version; loadErr is set when
// the embedded files are malformed (a build defect the tests catch).
var all, loadErr = load(sqlFiles)

var fileName = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.(up|down)\.sql$`)

func load(fsys fs.FS) ([]migration, error) {
	entries, err := fs.ReadDir(fsys, "sql")
	if err != nil {
		return nil, fmt.Errorf("migrate: read embedded sql: %w", err)
	}
	byVersion := map[int]*migration{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migrate: embedded file %s: name is not NNN_name.(up|down).sql", e.Name())
		}
		version, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, "sql/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("migrate: read %s: %w", e.Name(), err)
		}
		tmpl, err := template.New(e.Name()).Option("missingkey=error").Parse(string(body))
		if err != nil {
			return nil, fmt.Errorf("migrate: parse %s: %w", e.Name(), err)
		}
		mig := byVersion[version]
		if mig == nil {
			mig = &migration{version: version, name: m[2]}
			byVersion[version] = mig
		}
		if mig.name != m[2] {
			return nil, fmt.Errorf("migrate: version %d has two names: %s and %s", version, mig.name, m[2])
		}
		if m[3] == "up" {
			mig.up = tmpl
		} else {
			mig.down = tmpl
		}
	}
	out := make([]migration, 0, len(byVersion))
	for _, mig := range byVersion {
		if mig.up == nil || mig.down == nil {
			return nil, fmt.Errorf("migrate: version %d needs both an up and a down file", mig.version)
		}
		out = append(out, *mig)
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	if len(out) == 0 {
		return nil, errors.New("migrate: no embedded migrations")
	}
	return out, nil
}

// templateData is what the SQL templates see: identifiers, already quoted.
type templateData struct {
	// Schema is the quoted schema.
	Schema string
	// ProcessedMessages and ConsumerPositions are schema-qualified and quoted.
	ProcessedMessages string
	ConsumerPositions string
	// ProcessedMessagesProcessedAtIndex is the quoted, unqualified name of the
	// index on processed_at (an index lives in its table's schema).
	ProcessedMessagesProcessedAtIndex string
	// Outbox, IdempotencyRecords, ParkedMessages, DLQReplays, DLQValues and
	// ConsoleAudit are schema-qualified and quoted.
	Outbox             string
	IdempotencyRecords string
	ParkedMessages     string
	DLQReplays         string
	DLQValues          string
	ConsoleAudit       string

	raw Tables // unquoted table names, for Index
}

// Index returns the quoted, unqualified name of an index on the table that
// Tables names by field (for example "Outbox"), ending in suffix. Templates
// call it as {{.Index "Outbox" "_pending_idx"}}.
func (d templateData) Index(field, suffix string) (string, error) {
	var table string
	switch field {
	case "ProcessedMessages":
		table = d.raw.ProcessedMessages
	case "ConsumerPositions":
		table = d.raw.ConsumerPositions
	case "Outbox":
		table = d.raw.Outbox
	case "IdempotencyRecords":
		table = d.raw.IdempotencyRecords
	case "ParkedMessages":
		table = d.raw.ParkedMessages
	case "DLQReplays":
		table = d.raw.DLQReplays
	case "DLQValues":
		table = d.raw.DLQValues
	case "ConsoleAudit":
		table = d.raw.ConsoleAudit
	default:
		return "", fmt.Errorf("migrate: no table field %q", field)
	}
	return pgx.Identifier{indexName(table, suffix)}.Sanitize(), nil
}

// Literal returns s as a quoted SQL string literal: templates pass a
// quoted identifier to a function that takes text, as in
// {{.Literal .ProcessedMessages}}::regclass.
func (d templateData) Literal(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// step is one migration rendered for a Config.
type step struct {
	version  int
	name     string
	up, down string
}

// Migrator applies and reverts idemkit's migrations in one schema. It is safe
// for concurrent use, and several Migrators (in one process or many) may run
// against the same schema at once: steps are serialized by an advisory lock.
type Migrator struct {
	db         *pgxpool.Pool
	schema     string // raw, for the lock key and catalog lookups
	qSchema    string // quoted
	migrations string // qualified and quoted
	steps      []step
	log        *slog.Logger
	// serverVersion reads the server's version (readServerVersion on db;
	// tests replace it).
	serverVersion func(ctx context.Context) (num int, server string, err error)
}

// New returns a Migrator for the tables cfg names. cfg may be nil, meaning
// every default. It validates cfg and renders the migrations; it does not
// touch the database.
func New(db *pgxpool.Pool, cfg *Config) (*Migrator, error) {
	if loadErr != nil {
		return nil, loadErr
	}
	if db == nil {
		return nil, fmt.Errorf("%w: nil pool", ErrInvalidConfig)
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	t := c.Tables.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}
	data := templateData{
		Schema:            pgx.Identifier{t.Schema}.Sanitize(),
		ProcessedMessages: pgx.Identifier{t.Schema, t.ProcessedMessages}.Sanitize(),
		ConsumerPositions: pgx.Identifier{t.Schema, t.ConsumerPositions}.Sanitize(),
		ProcessedMessagesProcessedAtIndex: pgx.Identifier{
			indexName(t.ProcessedMessages, "_processed_at_idx"),
		}.Sanitize(),
		Outbox:             pgx.Identifier{t.Schema, t.Outbox}.Sanitize(),
		IdempotencyRecords: pgx.Identifier{t.Schema, t.IdempotencyRecords}.Sanitize(),
		ParkedMessages:     pgx.Identifier{t.Schema, t.ParkedMessages}.Sanitize(),
		DLQReplays:         pgx.Identifier{t.Schema, t.DLQReplays}.Sanitize(),
		DLQValues:          pgx.Identifier{t.Schema, t.DLQValues}.Sanitize(),
		ConsoleAudit:       pgx.Identifier{t.Schema, t.ConsoleAudit}.Sanitize(),
		raw:                t,
	}
	m := &Migrator{
		db:         db,
		schema:     t.Schema,
		qSchema:    data.Schema,
		migrations: pgx.Identifier{t.Schema, t.Migrations}.Sanitize(),
		log:        cmp.Or(c.Logger, slog.Default()),
	}
	m.serverVersion = func(ctx context.Context) (int, string, error) { return readServerVersion(ctx, db) }
	for _, mig := range all {
		up, err := render(mig.up, data)
		if err != nil {
			return nil, err
		}
		down, err := render(mig.down, data)
		if err != nil {
			return nil, err
		}
		m.steps = append(m.steps, step{version: mig.version, name: mig.name, up: up, down: down})
	}
	return m, nil
}

func render(t *template.Template, data templateData) (string, error) {
	var b strings.Builder
	if err := t.Execute(&b, data); err != nil {
		return "", fmt.Errorf("migrate: render %s: %w", t.Name(), err)
	}
	return b.String(), nil
}

// DerivedName returns the unquoted name idemkit gives an object derived
// from table (an index, a constraint, a companion table such as the daily
// dedup table, or one of its partitions): table followed by suffix, with
// table shortened and tagged with a hash of it when the whole would exceed
// MaxIdentifierLength. Package dedup names what it creates with it.
func DerivedName(table, suffix string) string { return indexName(table, suffix) }

// indexName derives an index name from its table's name that PostgreSQL
// will not truncate: table+suffix when that fits in MaxIdentifierLength
// bytes, else a prefix of table cut at a character boundary, a hash of the
// whole table name (so two long names sharing a prefix still differ), and
// suffix.
func indexName(table, suffix string) string {
	if len(table)+len(suffix) <= MaxIdentifierLength {
		return table + suffix
	}
	h := fnv.New32a()
	h.Write([]byte(table))
	tag := fmt.Sprintf("_%08x", h.Sum32())
	keep := MaxIdentifierLength - len(suffix) - len(tag)
	for keep > 0 && !utf8.RuneStart(table[keep]) {
		keep--
	}
	return table[:keep] + tag + suffix
}

// Known returns every version this build knows, ascending.
func Known() []int {
	out := make([]int, len(all))
	for i, m := range all {
		out[i] = m.version
	}
	return out
}

// Latest returns the highest version this build knows.
func (m *Migrator) Latest() int { return m.steps[len(m.steps)-1].version }

// Versions returns the applied versions, ascending. It returns none, without
// creating anything, when the schema has never been migrated.
func (m *Migrator) Versions(ctx context.Context) ([]int, error) {
	exists, err := m.bookkeepingExists(ctx, m.db)
	if err != nil {
		return nil, fmt.Errorf("migrate: versions: %w", err)
	}
	if !exists {
		return nil, nil
	}
	rows, err := m.db.Query(ctx, "SELECT version FROM "+m.migrations+" ORDER BY version")
	if err != nil {
		return nil, fmt.Errorf("migrate: versions: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("migrate: versions: %w", err)
	}
	return versions, nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (m *Migrator) bookkeepingExists(ctx context.Context, q querier) (bool, error) {
	var exists bool
	err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", m.migrations).Scan(&exists)
	return exists, err
}

// Up applies every pending version in ascending order, each in its own
// transaction together with its row in the migrations table, and returns the
// versions it applied (none when the schema was up to date). It creates the
// schema and the migrations table first when they are missing. Concurrent
// calls, from any number of processes, apply each version once. A server
// older than MinServerVersion is refused with a *ServerVersionError before
// anything is created or changed.
//
// Up waits out a server that cannot be reached, refuses connections or is
// starting up or shutting down (SQLSTATE class 08, 57P01-57P03, ...): it logs
// a Warn when it starts waiting and an Info when the server answers, and
// retries the step it was at (a step applied by a transaction whose commit
// was lost is seen as applied and skipped). It waits until ctx ends; the
// error then wraps ctx's error and the last connection error.
func (m *Migrator) Up(ctx context.Context) (applied []int, err error) {
	w := &outage.Waiter{Op: "migrate up " + m.schema, Log: m.log}
	defer w.Stop()
	if err := waitOut(ctx, w, m.checkServer); err != nil {
		return nil, fmt.Errorf("migrate: up: %w", err)
	}
	if err := waitOut(ctx, w, m.ensureBookkeeping); err != nil {
		return nil, fmt.Errorf("migrate: up: %w", err)
	}
	for _, s := range m.steps {
		done := false
		err := waitOut(ctx, w, func(ctx context.Context) error {
			done = false
			return m.inLockedTx(ctx, func(tx pgx.Tx) error {
				var exists bool
				if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+m.migrations+" WHERE version = $1)",
					s.version).Scan(&exists); err != nil {
					return err
				}
				if exists {
					return nil
				}
				if _, err := tx.Exec(ctx, s.up); err != nil {
					return err
				}
				if _, err := tx.Exec(ctx, "INSERT INTO "+m.migrations+" (version, name) VALUES ($1, $2)",
					s.version, s.name); err != nil {
					return err
				}
				done = true
				return nil
			})
		})
		if err != nil {
			return applied, fmt.Errorf("migrate: up %03d_%s: %w", s.version, s.name, err)
		}
		if done {
			applied = append(applied, s.version)
		}
	}
	return applied, nil
}

// waitOut runs op until it succeeds or fails with an error that is not a
// connection error, waiting between tries while the server cannot be
// reached (w logs the outage). When ctx ends during an outage, the error
// wraps both ctx's error and op's last error.
func waitOut(ctx context.Context, w *outage.Waiter, op func(ctx context.Context) error) error {
	var last error
	err := w.Do(ctx, func(ctx context.Context) error {
		last = op(ctx)
		return last
	})
	if err != nil && w.InOutage() && last != nil && err != last {
		return fmt.Errorf("waiting for the server: %w; last error: %w", err, last)
	}
	return err
}

// Down reverts every applied version greater than target, in descending
// order, each in its own transaction together with the removal of its row,
// and returns the versions it reverted. Down(ctx, 0) removes every idemkit
// table but the migrations table. It fails, reverting nothing, when a version
// to revert is unknown to this build.
func (m *Migrator) Down(ctx context.Context, target int) (reverted []int, err error) {
	if target < 0 {
		return nil, fmt.Errorf("migrate: down: negative target %d", target)
	}
	applied, err := m.Versions(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: down: %w", err)
	}
	var todo []step
	for _, v := range slices.Backward(applied) {
		if v <= target {
			break
		}
		i := slices.IndexFunc(m.steps, func(s step) bool { return s.version == v })
		if i < 0 {
			return nil, fmt.Errorf("migrate: down: applied version %d is unknown to this build (latest %d)", v, m.Latest())
		}
		todo = append(todo, m.steps[i])
	}
	for _, s := range todo {
		done := false
		err := m.inLockedTx(ctx, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, "DELETE FROM "+m.migrations+" WHERE version = $1", s.version)
			if err != nil || tag.RowsAffected() == 0 {
				return err // reverted by someone else meanwhile
			}
			if _, err := tx.Exec(ctx, s.down); err != nil {
				return err
			}
			done = true
			return nil
		})
		if err != nil {
			return reverted, fmt.Errorf("migrate: down %03d_%s: %w", s.version, s.name, err)
		}
		if done {
			reverted = append(reverted, s.version)
		}
	}
	return reverted, nil
}

// ensureBookkeeping creates the schema and the migrations table when missing.
// Existence is checked first so that a user without CREATE privilege can run
// Up against a schema that someone else created.
func (m *Migrator) ensureBookkeeping(ctx context.Context) error {
	return m.inLockedTx(ctx, func(tx pgx.Tx) error {
		var schemaExists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)",
			m.schema).Scan(&schemaExists); err != nil {
			return err
		}
		if !schemaExists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+m.qSchema); err != nil {
				return err
			}
		}
		exists, err := m.bookkeepingExists(ctx, tx)
		if err != nil || exists {
			return err
		}
		// The bookkeeping table is the one table created outside a versioned
		// migration: it records them.
		_, err = tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+m.migrations+` (
			version    int         PRIMARY KEY,
			name       text        NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now()
		)`)
		return err
	})
}

// inLockedTx runs fn in a transaction that first takes the schema's
// migration lock, held until commit or rollback.
func (m *Migrator) inLockedTx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	tx, err := m.db.Begin(ctx)
	if err != nil {
		return err
	}
	// A no-op after Commit; WithoutCancel so a cancelled caller still
	// releases the transaction.
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext($1))",
		lockPrefix+m.schema); err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
