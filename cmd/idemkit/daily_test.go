package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/internal/testenv"
	"github.com/idemkit/idemkit/migrate"
)

// TestDedupDaily: `idemkit dedup daily` enables the daily layout, shows it
// with its partitions, and maintains them; bad flags are usage errors that
// change nothing.
func TestDedupDaily(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := binary(t)
	db := testenv.NewDB(t, testenv.Migrate)
	env := []string{"IDEMKIT_DATABASE_URL=" + testenv.DatabaseURL(t)}
	schema := []string{"-schema", db.Schema}

	out, _, code := cli(t, bin, env, append([]string{"dedup", "daily", "status"}, schema...)...)
	if code != 0 || !strings.Contains(out, "layout: flat") {
		t.Fatalf("status before: %d %q", code, out)
	}
	for _, bad := range [][]string{{"-keep-days", "-2"}, {"-ahead-days", "-1"}, {"-ahead-days", "400"}, {"extra"}} {
		if _, errOut, code := cli(t, bin, env, append(append([]string{"dedup", "daily", "enable"}, bad...), schema...)...); code != 2 || errOut == "" {
			t.Fatalf("enable %v: exit %d, stderr %q; want a usage error", bad, code, errOut)
		}
	}
	out, _, code = cli(t, bin, env, append([]string{"dedup", "daily", "status", "-json"}, schema...)...)
	var st struct {
		Layout string `json:"layout"`
		Parts  []struct {
			Day string `json:"day"`
		} `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.Layout != "flat" || len(st.Parts) != 0 {
		t.Fatalf("status -json after refused enables: %d %q (%v)", code, out, err)
	}

	out, errOut, code := cli(t, bin, env, append([]string{"dedup", "daily", "enable", "-keep-days", "7", "-ahead-days", "3"}, schema...)...)
	if code != 0 || !strings.Contains(out, "7 day(s) kept, 3 day(s) created ahead") {
		t.Fatalf("enable: %d %q %q", code, out, errOut)
	}
	out, _, code = cli(t, bin, env, append([]string{"dedup", "daily", "status", "-json"}, schema...)...)
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.Layout != "daily" || len(st.Parts) != 2 {
		t.Fatalf("status -json: %d %q (%v); want daily with 2 partitions", code, out, err)
	}
	// A partition gone (say, dropped by hand): maintain makes it again.
	store, err := dedup.New(&dedup.Config{Tables: migrate.Tables{Schema: db.Schema}})
	if err != nil {
		t.Fatal(err)
	}
	parts, err := store.Partitions(ctx, db.Pool)
	if err != nil || len(parts) != 2 {
		t.Fatalf("partitions: %v %v", parts, err)
	}
	if _, err := db.Pool.Exec(ctx, `DROP TABLE `+pgx.Identifier{db.Schema, parts[1].Name}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	out, _, code = cli(t, bin, env, append([]string{"dedup", "daily", "maintain"}, schema...)...)
	if want := "created 1 partition(s) " + parts[1].Day.Format(time.DateOnly) + ", dropped 0"; code != 0 || !strings.Contains(out, want) {
		t.Fatalf("maintain: %d %q, want %q", code, out, want)
	}
	out, _, code = cli(t, bin, env, append([]string{"dedup", "daily", "status"}, schema...)...)
	if code != 0 || !strings.Contains(out, "layout: daily") || strings.Count(out, "rows") != 2 {
		t.Fatalf("status: %d %q", code, out)
	}
}
