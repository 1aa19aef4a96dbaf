package migrate_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

func newMigrator(t *testing.T, pool *pgxpool.Pool, cfg *migrate.Config) *migrate.Migrator {
	t.Helper()
	m, err := migrate.New(pool, cfg)
	if err != nil {
		t.Fatalf("migrate.New: %v", err)
	}
	return m
}

// knownDesc is every known version, newest first: the order Down reverts in.
func knownDesc() []int {
	v := migrate.Known()
	slices.Reverse(v)
	return v
}

func wantInts(t *testing.T, what string, got []int, want ...int) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

// relExists reports whether the qualified, quoted relation exists.
func relExists(t *testing.T, pool *pgxpool.Pool, qualified string) bool {
	t.Helper()
	var ok bool
	if err := pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", qualified).Scan(&ok); err != nil {
		t.Fatalf("to_regclass(%s): %v", qualified, err)
	}
	return ok
}

type column struct {
	name, typ string
	notNull   bool
	def       string
}

func columns(t *testing.T, pool *pgxpool.Pool, qualified string) []column {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod), a.attnotnull,
		       coalesce(pg_catalog.pg_get_expr(d.adbin, d.adrelid), '')
		FROM pg_catalog.pg_attribute a
		LEFT JOIN pg_catalog.pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, qualified)
	if err != nil {
		t.Fatalf("columns of %s: %v", qualified, err)
	}
	var out []column
	var c column
	if _, err := pgx.ForEachRow(rows, []any{&c.name, &c.typ, &c.notNull, &c.def}, func() error {
		out = append(out, c)
		return nil
	}); err != nil {
		t.Fatalf("columns of %s: %v", qualified, err)
	}
	return out
}

// indexes returns "name: definition" of every index on the relation, sorted.
func indexes(t *testing.T, pool *pgxpool.Pool, qualified string) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT c.relname, pg_catalog.pg_get_indexdef(i.indexrelid)
		FROM pg_catalog.pg_index i JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid
		WHERE i.indrelid = $1::regclass`, qualified)
	if err != nil {
		t.Fatalf("indexes of %s: %v", qualified, err)
	}
	out := map[string]string{}
	var name, def string
	if _, err := pgx.ForEachRow(rows, []any{&name, &def}, func() error {
		out[name] = def
		return nil
	}); err != nil {
		t.Fatalf("indexes of %s: %v", qualified, err)
	}
	return out
}

func TestUpDownUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	m := newMigrator(t, db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: db.Schema}})
	processed := db.Table(migrate.ProcessedMessagesDefault)
	positions := db.Table(migrate.ConsumerPositionsDefault)
	bookkeeping := db.Table(migrate.MigrationsDefault)

	if got, known := m.Latest(), migrate.Known(); got != known[len(known)-1] {
		t.Fatalf("Latest = %d, want %d", got, known[len(known)-1])
	}
	v, err := m.Versions(ctx)
	if err != nil {
		t.Fatalf("Versions before Up: %v", err)
	}
	wantInts(t, "Versions before Up", v)
	if relExists(t, db.Pool, bookkeeping) {
		t.Fatal("Versions created the migrations table")
	}

	applied, err := m.Up(ctx)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	wantInts(t, "Up applied", applied, migrate.Known()...)
	v, err = m.Versions(ctx)
	if err != nil {
		t.Fatalf("Versions: %v", err)
	}
	wantInts(t, "Versions after Up", v, migrate.Known()...)

	var name string
	var recent bool
	if err := db.Pool.QueryRow(ctx, "SELECT name, applied_at > now() - interval '1 minute' FROM "+bookkeeping+
		" WHERE version = 1").Scan(&name, &recent); err != nil {
		t.Fatalf("read version row: %v", err)
	}
	if name != "baseline" || !recent {
		t.Fatalf("version row = (%q, recent=%v), want (\"baseline\", true)", name, recent)
	}

	wantProcessed := []column{
		{"consumer", "text", true, ""},
		{"message_id", "text", false, ""},
		{"message_uuid", "uuid", false, ""},
		{"topic", "text", true, ""},
		{"kafka_partition", "integer", true, ""},
		{"kafka_offset", "bigint", true, ""},
		{"processed_at", "timestamp with time zone", true, "now()"},
	}
	if got := columns(t, db.Pool, processed); !slices.Equal(got, wantProcessed) {
		t.Fatalf("processed_messages columns:\n got  %v\n want %v", got, wantProcessed)
	}
	wantPositions := []column{
		{"consumer", "text", true, ""},
		{"topic", "text", true, ""},
		{"kafka_partition", "integer", true, ""},
		{"next_offset", "bigint", true, ""},
		{"updated_at", "timestamp with time zone", true, "now()"},
		{"incarnation", "bigint", true, "0"},
		{"anchor_time", "timestamp with time zone", false, ""},
		{"anchor_offset", "bigint", false, ""},
		{"epoch", "bigint", true, "0"},
	}
	if got := columns(t, db.Pool, positions); !slices.Equal(got, wantPositions) {
		t.Fatalf("consumer_positions columns:\n got  %v\n want %v", got, wantPositions)
	}
	idx := indexes(t, db.Pool, processed)
	if def := idx["processed_messages_id_key"]; !strings.Contains(def, "UNIQUE") ||
		!strings.HasSuffix(def, "(consumer, message_id) WHERE (message_id IS NOT NULL)") {
		t.Fatalf("processed_messages text key = %q; all indexes %v", def, idx)
	}
	if def := idx["processed_messages_uuid_key"]; !strings.Contains(def, "UNIQUE") ||
		!strings.HasSuffix(def, "(consumer, message_uuid) WHERE (message_uuid IS NOT NULL)") {
		t.Fatalf("processed_messages uuid key = %q; all indexes %v", def, idx)
	}
	if _, ok := idx["processed_messages_pkey"]; ok {
		t.Fatalf("processed_messages kept its primary key; all indexes %v", idx)
	}
	if def := idx["processed_messages_processed_at_idx"]; !strings.HasSuffix(def, "(processed_at)") {
		t.Fatalf("processed_at index = %q; all indexes %v", def, idx)
	}
	idx = indexes(t, db.Pool, positions)
	if def := idx["consumer_positions_pkey"]; !strings.HasSuffix(def, "(consumer, topic, kafka_partition)") {
		t.Fatalf("consumer_positions primary key = %q; all indexes %v", def, idx)
	}
	replays := db.Table(migrate.DLQReplaysDefault)
	wantReplays := []column{
		{"origin_topic", "text", true, ""},
		{"origin_incarnation", "bigint", true, "0"},
		{"origin_partition", "integer", true, ""},
		{"origin_offset", "bigint", true, ""},
		{"replay_round", "integer", true, ""},
		{"dead_letter_topic", "text", true, ""},
		{"message_id", "text", true, ""},
		{"consumer", "text", true, ""},
		{"outcome", "text", true, ""},
		{"detail", "text", false, ""},
		{"replayed_by", "text", true, ""},
		{"replayed_at", "timestamp with time zone", true, "now()"},
	}
	if got := columns(t, db.Pool, replays); !slices.Equal(got, wantReplays) {
		t.Fatalf("dlq_replays columns:\n got  %v\n want %v", got, wantReplays)
	}
	idx = indexes(t, db.Pool, replays)
	if def := idx["idemkit_dlq_replays_pkey"]; !strings.HasSuffix(def,
		"(origin_topic, origin_incarnation, origin_partition, origin_offset, replay_round)") {
		t.Fatalf("dlq_replays primary key = %q; all indexes %v", def, idx)
	}

	// Up again: nothing to do.
	applied, err = m.Up(ctx)
	if err != nil {
		t.Fatalf("second Up: %v", err)
	}
	wantInts(t, "second Up applied", applied)

	reverted, err := m.Down(ctx, 0)
	if err != nil {
		t.Fatalf("Down: %v", err)
	}
	wantInts(t, "Down reverted", reverted, knownDesc()...)
	if relExists(t, db.Pool, processed) || relExists(t, db.Pool, positions) {
		t.Fatal("tables still exist after Down(0)")
	}
	if !relExists(t, db.Pool, bookkeeping) {
		t.Fatal("Down dropped the migrations table")
	}
	v, err = m.Versions(ctx)
	if err != nil {
		t.Fatalf("Versions after Down: %v", err)
	}
	wantInts(t, "Versions after Down", v)
	reverted, err = m.Down(ctx, 0)
	if err != nil {
		t.Fatalf("second Down: %v", err)
	}
	wantInts(t, "second Down reverted", reverted)

	applied, err = m.Up(ctx)
	if err != nil {
		t.Fatalf("Up after Down: %v", err)
	}
	wantInts(t, "Up after Down applied", applied, migrate.Known()...)
	if !relExists(t, db.Pool, processed) || !relExists(t, db.Pool, positions) {
		t.Fatal("tables missing after Up, Down, Up")
	}
	// Down to the latest version reverts nothing.
	reverted, err = m.Down(ctx, m.Latest())
	if err != nil {
		t.Fatalf("Down(latest): %v", err)
	}
	wantInts(t, "Down(latest) reverted", reverted)
}

// TestOutboxIndexes: the relay's ready, waiting and wake-up indexes, the
// index of rows held behind another, the dispatcher's due and key indexes,
// the published and dead ones.
func TestOutboxIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	m := newMigrator(t, db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: db.Schema}})
	outbox := db.Table(migrate.OutboxDefault)
	want := map[string]string{
		"_handler_due_idx": "USING btree (handler, available_at, seq) INCLUDE (lock_key) WHERE ((published_at IS NULL) AND (dead_at IS NULL) AND (handler IS NOT NULL))",
		"_key_idx":         "USING btree (lock_key, seq) WHERE ((published_at IS NULL) AND (blocked_by IS NULL) AND (handler IS NOT NULL))",
		"_ready_idx":       "USING btree (seq) INCLUDE (lock_key) WHERE ((published_at IS NULL) AND (blocked_by IS NULL) AND (dead_at IS NULL) AND (NOT waiting) AND (handler IS NULL))",
		"_waiting_idx":     "USING btree (lock_key, seq) WHERE ((published_at IS NULL) AND (blocked_by IS NULL) AND waiting AND (handler IS NULL))",
		"_wake_idx":        "USING btree (available_at) WHERE ((published_at IS NULL) AND (blocked_by IS NULL) AND (dead_at IS NULL) AND waiting AND (handler IS NULL))",
		"_blocked_idx":     "USING btree (blocked_by) WHERE ((blocked_by IS NOT NULL) AND (published_at IS NULL))",
		"_published_idx":   "USING btree (published_at) WHERE (published_at IS NOT NULL)",
		"_dead_idx":        "USING btree (seq) WHERE (dead_at IS NOT NULL)",
		"_pkey":            "USING btree (seq)",
		"_id_key":          "USING btree (id)",
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("Up: %v", err)
	}
	got := indexes(t, db.Pool, outbox)
	if len(got) != len(want) {
		t.Fatalf("outbox indexes %v, want %d", got, len(want))
	}
	for suffix, def := range want {
		if d := got[migrate.OutboxDefault+suffix]; !strings.HasSuffix(d, def) {
			t.Fatalf("index %s%s = %q, want ...%q", migrate.OutboxDefault, suffix, d, def)
		}
	}
}

func TestCustomSchemaAndOddNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	// A schema that does not exist yet: Up creates it.
	schema := db.Schema + `_Odd "S"`
	dropSchemaAtCleanup(t, db.Pool, schema)
	cfg := &migrate.Config{Tables: migrate.Tables{
		Schema:            schema,
		ProcessedMessages: `Odd "Name"`,
		ConsumerPositions: `pos; DROP TABLE x; --`,
		Migrations:        `Mig.ratioñs`,
		DLQReplays:        `dlq "replays"; $$ --`,
	}}
	m := newMigrator(t, db.Pool, cfg)
	applied, err := m.Up(ctx)
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	wantInts(t, "Up applied", applied, migrate.Known()...)

	processed := pgx.Identifier{schema, `Odd "Name"`}.Sanitize()
	positions := pgx.Identifier{schema, `pos; DROP TABLE x; --`}.Sanitize()
	bookkeeping := pgx.Identifier{schema, `Mig.ratioñs`}.Sanitize()
	for _, rel := range []string{processed, positions, bookkeeping} {
		if !relExists(t, db.Pool, rel) {
			t.Fatalf("%s does not exist after Up", rel)
		}
	}
	if _, ok := indexes(t, db.Pool, processed)[`Odd "Name"_processed_at_idx`]; !ok {
		t.Fatalf("index on processed_at missing: %v", indexes(t, db.Pool, processed))
	}
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+processed+
		" (consumer, message_id, topic, kafka_partition, kafka_offset) VALUES ('c', 'm', 't', 0, 0)"); err != nil {
		t.Fatalf("insert into %s: %v", processed, err)
	}
	v, err := m.Versions(ctx)
	if err != nil {
		t.Fatalf("Versions: %v", err)
	}
	wantInts(t, "Versions", v, migrate.Known()...)

	// The default tables in the same schema are untouched by this config.
	if relExists(t, db.Pool, pgx.Identifier{schema, migrate.ProcessedMessagesDefault}.Sanitize()) {
		t.Fatal("default processed_messages created despite custom names")
	}

	reverted, err := m.Down(ctx, 0)
	if err != nil {
		t.Fatalf("Down: %v", err)
	}
	wantInts(t, "Down reverted", reverted, knownDesc()...)
	if relExists(t, db.Pool, processed) || relExists(t, db.Pool, positions) {
		t.Fatal("custom tables still exist after Down")
	}
	applied, err = m.Up(ctx)
	if err != nil {
		t.Fatalf("Up after Down: %v", err)
	}
	wantInts(t, "Up after Down applied", applied, migrate.Known()...)
}

func TestLongTableNamesGetDistinctIndexNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// 63 bytes each, sharing a 61-byte prefix of two-byte characters, so the
	// derived index names must be cut at a character boundary and still differ.
	prefix := strings.Repeat("é", 30) + "_"
	names := []string{prefix + "aa", prefix + "bb"}
	var indexNames []string
	for i, name := range names {
		db := testenv.NewDB(t) // a schema each: the other tables keep their default names
		if len(name) != 63 {
			t.Fatalf("test name is %d bytes, want 63", len(name))
		}
		m := newMigrator(t, db.Pool, &migrate.Config{Tables: migrate.Tables{
			Schema:            db.Schema,
			ProcessedMessages: name,
			ConsumerPositions: "positions_" + string(rune('a'+i)),
			Migrations:        "migrations_" + string(rune('a'+i)),
			DLQReplays:        strings.Replace(name, "_", "-", 1), // rebuilt by version 7
		}})
		applied, err := m.Up(ctx)
		if err != nil {
			t.Fatalf("Up with table %q: %v", name, err)
		}
		wantInts(t, "Up applied", applied, migrate.Known()...)
		for idx := range indexes(t, db.Pool, db.Table(name)) {
			if strings.HasSuffix(idx, "_processed_at_idx") {
				indexNames = append(indexNames, idx)
			}
		}
	}
	if len(indexNames) != 2 || indexNames[0] == indexNames[1] {
		t.Fatalf("processed_at index names = %q, want two distinct", indexNames)
	}
	for _, n := range indexNames {
		if len(n) > 63 || !utf8.ValidString(n) || !strings.HasPrefix(n, strings.Repeat("é", 18)) {
			t.Fatalf("index name %q (%d bytes): want <= 63 valid UTF-8 bytes derived from the table name", n, len(n))
		}
	}
}

func TestConcurrentUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	// A fresh schema, so that creating the schema and the migrations table
	// races too.
	schema := db.Schema + "_concurrent"
	dropSchemaAtCleanup(t, db.Pool, schema)

	const n = 4
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		results = make([][]int, n)
		errs    = make([]error, n)
	)
	for i := range n {
		m := newMigrator(t, db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
		wg.Go(func() {
			<-start
			results[i], errs[i] = m.Up(ctx)
		})
	}
	close(start)
	wg.Wait()
	var all []int
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("Up #%d: %v", i, errs[i])
		}
		all = append(all, results[i]...)
	}
	slices.Sort(all) // which migrator applied which version depends on timing
	wantInts(t, "versions applied by all migrators together", all, migrate.Known()...)
	v, err := newMigrator(t, db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}}).Versions(ctx)
	if err != nil {
		t.Fatalf("Versions: %v", err)
	}
	wantInts(t, "Versions", v, migrate.Known()...)
}

func TestDownRejectsUnknownVersionAndNegativeTarget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	m := newMigrator(t, db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("Up: %v", err)
	}
	if _, err := m.Down(ctx, -1); err == nil {
		t.Fatal("Down(-1) succeeded")
	}
	// A version applied by a newer build.
	if _, err := db.Pool.Exec(ctx, "INSERT INTO "+db.Table(migrate.MigrationsDefault)+
		" (version, name) VALUES (999, 'future')"); err != nil {
		t.Fatalf("insert future version: %v", err)
	}
	reverted, err := m.Down(ctx, 0)
	if err == nil || !strings.Contains(err.Error(), "999") {
		t.Fatalf("Down(0) with unknown version 999: reverted %v, err %v; want an error naming 999", reverted, err)
	}
	if !relExists(t, db.Pool, db.Table(migrate.ProcessedMessagesDefault)) {
		t.Fatal("Down reverted version 1 although it refused")
	}
	// Up leaves the unknown version alone.
	applied, err := m.Up(ctx)
	if err != nil {
		t.Fatalf("Up with a future version applied: %v", err)
	}
	wantInts(t, "Up applied", applied)
	v, err := m.Versions(ctx)
	if err != nil {
		t.Fatalf("Versions: %v", err)
	}
	wantInts(t, "Versions", v, append(migrate.Known(), 999)...)
}

func TestTables(t *testing.T) {
	t.Parallel()
	got := migrate.Tables{}.WithDefaults()
	want := migrate.Tables{
		Schema:             "public",
		ProcessedMessages:  "processed_messages",
		ConsumerPositions:  "consumer_positions",
		Migrations:         "idemkit_migrations",
		Outbox:             "idemkit_outbox",
		IdempotencyRecords: "idempotency_records",
		ParkedMessages:     "idemkit_parked_messages",
		DLQReplays:         "idemkit_dlq_replays",
		DLQValues:          "idemkit_dlq_values",
		ConsoleAudit:       "idemkit_console_audit",
	}
	if got != want {
		t.Fatalf("WithDefaults = %+v, want %+v", got, want)
	}
	custom := migrate.Tables{Schema: "s", ProcessedMessages: "p"}.WithDefaults()
	if custom.Schema != "s" || custom.ProcessedMessages != "p" || custom.ConsumerPositions != "consumer_positions" {
		t.Fatalf("WithDefaults overwrote set fields: %+v", custom)
	}

	tests := []struct {
		name  string
		cfg   migrate.Tables
		valid bool
	}{
		{"zero value", migrate.Tables{}, true},
		{"63 bytes", migrate.Tables{Schema: strings.Repeat("s", 63)}, true},
		{"odd characters", migrate.Tables{ProcessedMessages: `a "b"; c`}, true},
		{"64 bytes schema", migrate.Tables{Schema: strings.Repeat("s", 64)}, false},
		{"64 bytes table", migrate.Tables{Migrations: strings.Repeat("é", 32)}, false},
		{"NUL", migrate.Tables{ConsumerPositions: "a\x00b"}, false},
		{"invalid UTF-8", migrate.Tables{Schema: "a\xffb"}, false},
		{"same tables", migrate.Tables{ConsumerPositions: "processed_messages"}, false},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if tt.valid && err != nil {
			t.Errorf("%s: Validate = %v, want nil", tt.name, err)
		}
		if !tt.valid && !errors.Is(err, migrate.ErrInvalidConfig) {
			t.Errorf("%s: Validate = %v, want ErrInvalidConfig", tt.name, err)
		}
	}
}

func TestNew(t *testing.T) {
	t.Parallel()
	if _, err := migrate.New(nil, nil); err == nil {
		t.Fatal("New(nil pool) succeeded")
	}
	db := testenv.NewDB(t)
	if _, err := migrate.New(db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: "a\x00"}}); !errors.Is(err, migrate.ErrInvalidConfig) {
		t.Fatalf("New with NUL in schema: %v, want ErrInvalidConfig", err)
	}
	m, err := migrate.New(db.Pool, nil)
	if err != nil {
		t.Fatalf("New(pool, nil): %v", err)
	}
	if known := migrate.Known(); m.Latest() != known[len(known)-1] {
		t.Fatalf("Latest = %d, want %d", m.Latest(), known[len(known)-1])
	}
}
