package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestVersion14UsesPrebuiltIndexes: the indexes of version 14, built
// beforehand with CREATE UNIQUE INDEX CONCURRENTLY (what the migration's
// comment tells operators of large tables to do), are taken as they are;
// an index of the table left invalid makes the migration fail and change
// nothing.
func TestVersion14UsesPrebuiltIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	m := newMigrator(t, db.Pool, &migrate.Config{Schema: db.Schema})
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Down(ctx, 13); err != nil {
		t.Fatal(err)
	}
	table := db.Table(migrate.ProcessedMessagesDefault)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, topic, kafka_partition, kafka_offset)
		SELECT 'c', 'm' || g, 't', 0, g FROM generate_series(1, 100) AS g`); err != nil {
		t.Fatal(err)
	}
	idKey := db.Schema + `.processed_messages_id_key`
	for _, q := range []string{
		`CREATE UNIQUE INDEX CONCURRENTLY processed_messages_id_key ON ` + table + ` (consumer, message_id) WHERE message_id IS NOT NULL`,
		`ALTER TABLE ` + table + ` ADD COLUMN message_uuid uuid`,
		`CREATE UNIQUE INDEX CONCURRENTLY processed_messages_uuid_key ON ` + table + ` (consumer, message_uuid) WHERE message_uuid IS NOT NULL`,
		`UPDATE pg_catalog.pg_index SET indisvalid = false WHERE indexrelid = '` + idKey + `'::regclass`,
	} {
		if _, err := db.Pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	applied, err := m.Up(ctx)
	if err == nil || len(applied) != 0 || !strings.Contains(err.Error(), "processed_messages_id_key") {
		t.Fatalf("Up with an invalid prebuilt index: applied %v, err %v; want an error naming it", applied, err)
	}
	if idx := indexes(t, db.Pool, table); idx["processed_messages_pkey"] == "" {
		t.Fatalf("the failed migration changed the table: indexes %v", idx)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE pg_catalog.pg_index SET indisvalid = true WHERE indexrelid = '`+idKey+`'::regclass`); err != nil {
		t.Fatal(err)
	}
	oids := func() [2]uint32 {
		var o [2]uint32
		if err := db.Pool.QueryRow(ctx, `SELECT $1::regclass::oid, $2::regclass::oid`, idKey,
			db.Schema+`.processed_messages_uuid_key`).Scan(&o[0], &o[1]); err != nil {
			t.Fatal(err)
		}
		return o
	}
	before := oids()
	if applied, err := m.Up(ctx); err != nil || len(applied) == 0 || applied[0] != 14 {
		t.Fatalf("Up: %v, %v; want 14 first", applied, err)
	}
	if after := oids(); after != before {
		t.Fatalf("the prebuilt indexes were replaced (oids %v, now %v)", before, after)
	}
	idx := indexes(t, db.Pool, table)
	if _, ok := idx["processed_messages_pkey"]; ok || idx["processed_messages_uuid_key"] == "" {
		t.Fatalf("indexes after Up: %v", idx)
	}
	// The rows are all there and still unique by text.
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE message_id LIKE 'm%' AND message_uuid IS NULL`).Scan(&n); err != nil || n != 100 {
		t.Fatalf("rows after Up: %d, %v", n, err)
	}
	if _, err := db.Pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, topic, kafka_partition, kafka_offset)
		VALUES ('c', 'm1', 't', 0, 0)`); err == nil {
		t.Fatal("a second row for (c, m1) was accepted")
	}
	// Exactly one of the two keys.
	for _, vals := range []string{`('c', NULL, NULL)`, `('c', 'x', '7f3e2d1c-0b9a-4876-9543-210fedcba987')`} {
		if _, err := db.Pool.Exec(ctx, `INSERT INTO `+table+` (consumer, message_id, message_uuid, topic, kafka_partition, kafka_offset)
			SELECT c, i, u::uuid, 't', 0, 0 FROM (VALUES `+vals+`) AS v (c, i, u)`); err == nil {
			t.Fatalf("row %s accepted; want the CHECK to refuse it", vals)
		}
	}
}
