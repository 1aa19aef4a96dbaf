package migrate_test

import (
	"context"
	"slices"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestBaselineStorageAndLayout: the daily table and the layout row come
// empty and flat, the flat table has its autovacuum settings, the positions
// and idempotency tables their fillfactor; Down(0) drops all of it.
func TestBaselineStorageAndLayout(t *testing.T) {
	ctx := context.Background()
	db := testenv.NewDB(t)
	m := newMigrator(t, db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if _, err := m.Up(ctx); err != nil {
		t.Fatal(err)
	}
	flat := db.Table(migrate.ProcessedMessagesDefault)
	daily := db.Table(migrate.DerivedName(migrate.ProcessedMessagesDefault, "_daily"))
	layout := db.Table(migrate.DerivedName(migrate.ProcessedMessagesDefault, "_layout"))
	positions := db.Table(migrate.ConsumerPositionsDefault)
	reloptions := func(table string) []string {
		var opts []string
		if err := db.Pool.QueryRow(ctx, `SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = $1::regclass`, table).Scan(&opts); err != nil {
			t.Fatal(err)
		}
		return opts
	}
	if got := reloptions(flat); !slices.Contains(got, "autovacuum_vacuum_scale_factor=0.01") || !slices.Contains(got, "autovacuum_vacuum_threshold=10000") {
		t.Fatalf("flat table's options %v, want the autovacuum settings", got)
	}
	if got := reloptions(positions); !slices.Equal(got, []string{"fillfactor=50"}) {
		t.Fatalf("positions table's options %v, want fillfactor=50", got)
	}
	var kind string
	if err := db.Pool.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = $1::regclass`, daily).Scan(&kind); err != nil || kind != "p" {
		t.Fatalf("daily table kind %q (%v), want p (partitioned)", kind, err)
	}
	var rows int
	var flatLayout bool
	if err := db.Pool.QueryRow(ctx, `SELECT count(*), bool_and(daily_from IS NULL AND NOT daily_ready) FROM `+layout).Scan(&rows, &flatLayout); err != nil ||
		rows != 1 || !flatLayout {
		t.Fatalf("layout rows %d, flat %v (%v); want one flat row", rows, flatLayout, err)
	}
	if got := reloptions(db.Table(migrate.IdempotencyRecordsDefault)); !slices.Equal(got, []string{"fillfactor=70"}) {
		t.Fatalf("idempotency table's options %v, want fillfactor=70", got)
	}
	if _, err := m.Down(ctx, 0); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{flat, daily, layout, positions} {
		if relExists(t, db.Pool, table) {
			t.Fatalf("%s still there after Down(0)", table)
		}
	}
}
