package migrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestCheckServerVersion: a server older than MinServerVersion is refused
// with a *ServerVersionError that names both versions and matches
// ErrServerTooOld; MinServerVersion and newer pass.
func TestCheckServerVersion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		num    int
		server string
		ok     bool
	}{
		{90624, "9.6.24", false},
		{130016, "13.16", false},
		{139999, "13.99", false},
		{140000, "14.0", true},
		{140025, "14.25", true},
		{150015, "15.15 (Debian 15.15-0+deb12u1)", true},
		{180007, "18.7", true},
	} {
		err := migrate.CheckServerVersion(c.num, c.server)
		if c.ok {
			if err != nil {
				t.Errorf("CheckServerVersion(%d, %q) = %v, want nil", c.num, c.server, err)
			}
			continue
		}
		var verr *migrate.ServerVersionError
		if !errors.As(err, &verr) || !errors.Is(err, migrate.ErrServerTooOld) {
			t.Errorf("CheckServerVersion(%d, %q) = %v, want a *ServerVersionError matching ErrServerTooOld", c.num, c.server, err)
			continue
		}
		if verr.Num != c.num || verr.Server != c.server {
			t.Errorf("CheckServerVersion(%d, %q): error carries %d, %q", c.num, c.server, verr.Num, verr.Server)
		}
		if msg := err.Error(); !strings.Contains(msg, "PostgreSQL "+c.server) || !strings.Contains(msg, "PostgreSQL 14") {
			t.Errorf("CheckServerVersion(%d, %q) says %q, want both versions named", c.num, c.server, msg)
		}
	}
}

// TestUpRefusesOldServerFirst: Up on a server that reports 13 fails with
// ErrServerTooOld and leaves the database as it was (not even the schema or
// the migrations table is created); on the real server (14 or newer) the
// same schema migrates.
func TestUpRefusesOldServerFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.NewDB(t)
	schema := testenv.Name(t, "old")
	dropSchemaAtCleanup(t, db.Pool, schema)
	schemaExists := func() bool {
		t.Helper()
		var ok bool
		if err := db.Pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)",
			schema).Scan(&ok); err != nil {
			t.Fatal(err)
		}
		return ok
	}

	m := newMigrator(t, db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
	migrate.SetServerVersion(m, func(context.Context) (int, string, error) { return 130016, "13.16", nil })
	applied, err := m.Up(ctx)
	if !errors.Is(err, migrate.ErrServerTooOld) || len(applied) != 0 {
		t.Fatalf("Up on PostgreSQL 13.16 = %v, %v; want nothing applied and ErrServerTooOld", applied, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "PostgreSQL 13.16") || !strings.Contains(msg, "PostgreSQL 14") {
		t.Fatalf("Up on PostgreSQL 13.16 says %q, want both versions named", msg)
	}
	if schemaExists() {
		t.Fatal("Up refused the server but created the schema first")
	}

	applied, err = newMigrator(t, db.Pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}}).Up(ctx)
	if err != nil || len(applied) != len(migrate.Known()) {
		t.Fatalf("Up on the test server = %v, %v; want every version applied", applied, err)
	}
	if !schemaExists() {
		t.Fatal("Up applied every version but there is no schema")
	}
}
