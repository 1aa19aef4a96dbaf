package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestBadFlagValues: a flag value out of its range is bad usage: exit 2
// with the usage, before anything is read or changed. That holds for values
// a command could take quietly (-batch -1, -limit -1, -limit 0), for values
// that would only fail at run time (dlq replay -rate -1, -replay-limit -1,
// -max-outage -1s), for -schema "" (not public), and for migrate down to a
// version above the latest.
func TestBadFlagValues(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t, func(ctx context.Context, pool *pgxpool.Pool, schema string) error {
		m, err := migrate.New(pool, &migrate.Config{Tables: migrate.Tables{Schema: schema}})
		if err == nil {
			_, err = m.Up(ctx)
		}
		return err
	})
	topic := testenv.NewTopic(t, 1)
	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t),
		"IDEMKIT_KAFKA_BROKERS=" + strings.Join(testenv.Brokers(t), ",")}
	s := []string{"-schema", db.Schema}
	latest := slices.Max(migrate.Known())
	for _, args := range [][]string{
		append([]string{"dedup", "purge", "-older-than", "1h", "-batch", "-1"}, s...),
		append([]string{"dedup", "purge", "-older-than", "1h", "-batch", "0"}, s...),
		append([]string{"idemhttp", "stuck", "-limit", "-1"}, s...),
		append([]string{"idemhttp", "stuck", "-limit", "0"}, s...),
		append([]string{"idemhttp", "stuck", "-table", ""}, s...),
		append([]string{"outbox", "stats", "-table", " "}, s...),
		append([]string{"dlq", "replay", "-topic", topic, "-rate", "-1"}, s...),
		append([]string{"dlq", "replay", "-topic", topic, "-rate", "NaN"}, s...),
		append([]string{"dlq", "replay", "-topic", topic, "-replay-limit", "-1"}, s...),
		append([]string{"dlq", "replay", "-topic", topic, "-replay-limit", "0"}, s...),
		append([]string{"dlq", "replay", "-topic", topic, "-max-outage", "-1s"}, s...),
		{"migrate", "status", "-schema", ""},
		{"dedup", "purge", "-older-than", "1h", "-schema", ""},
		append([]string{"migrate", "down", "99"}, s...),
		append([]string{"migrate", "down", fmt.Sprint(latest + 1)}, s...),
	} {
		out, errOut, code := cli(t, bin, env, args...)
		if code != 2 || !strings.Contains(errOut, "usage:") || out != "" {
			t.Errorf("%q: exit %d, want 2 with usage and nothing on stdout\nstdout: %sstderr: %s", args, code, out, errOut)
		}
	}
	// Nothing was changed: the schema is still at the latest version.
	out, errOut, code := cli(t, bin, env, append([]string{"migrate", "status"}, s...)...)
	if code != 0 || !strings.Contains(out, fmt.Sprint(migrate.Known())) {
		t.Fatalf("migrate status after the refused commands: exit %d\nstdout: %sstderr: %s", code, out, errOut)
	}
}

// TestMigrateDownSaysTheRealVersion: migrate down prints the version the
// schema is at, not the target it was given.
func TestMigrateDownSaysTheRealVersion(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t) // never migrated
	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t)}
	target := slices.Max(migrate.Known()) - 1
	out, errOut, code := cli(t, bin, env, "migrate", "down", fmt.Sprint(target), "-schema", db.Schema)
	want := fmt.Sprintf("schema %s is at version 0\n", db.Schema)
	if code != 0 || !strings.HasSuffix(out, want) {
		t.Fatalf("migrate down %d on an unmigrated schema: exit %d, want 0 and %q\nstdout: %sstderr: %s",
			target, code, want, out, errOut)
	}
}

// TestUnmigratedSchemaHint: a command run on a schema that was never
// migrated fails (exit 1) with one line that says to run idemkit migrate
// up, not a bare SQLSTATE 42P01.
func TestUnmigratedSchemaHint(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	db := testenv.NewDB(t) // never migrated
	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t)}
	for _, args := range [][]string{
		{"dedup", "purge", "-older-than", "1h", "-schema", db.Schema},
		{"idemhttp", "stuck", "-schema", db.Schema},
		{"outbox", "stats", "-schema", db.Schema},
	} {
		out, errOut, code := cli(t, bin, env, args...)
		if code != 1 || !strings.Contains(errOut, "idemkit migrate up") || strings.Count(errOut, "\n") != 1 || out != "" {
			t.Errorf("%q: exit %d, want 1 with one line naming idemkit migrate up\nstdout: %sstderr: %s", args, code, out, errOut)
		}
	}
}

// TestMigrateUpWaitsForTheServer: migrate up against a server that does not
// answer waits for it, says so on stderr, and fails with one line once -wait
// has passed.
func TestMigrateUpWaitsForTheServer(t *testing.T) {
	t.Parallel()
	bin := binary(t)
	out, errOut, code := cli(t, bin, nil, "migrate", "up", "-wait", "1s",
		"-database", "postgres://nobody@127.0.0.1:1/x?connect_timeout=2")
	lines := strings.Split(strings.TrimSpace(errOut), "\n")
	if code != 1 || out != "" || !strings.Contains(errOut, "server unreachable; waiting it out") ||
		!strings.Contains(lines[len(lines)-1], "did not answer within -wait 1s") {
		t.Fatalf("migrate up -wait 1s on a closed port: exit %d, want 1, a line saying it waits and one saying it gave up\nstdout: %sstderr: %s",
			code, out, errOut)
	}
	t.Logf("stderr:\n%s", errOut)
}
