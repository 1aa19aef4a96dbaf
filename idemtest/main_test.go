package idemtest_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idemkit/internal/testenv"
)

// The kit's own tests use the harness every idemkit package uses (servers
// from the environment, goleak); the kit itself and its examples do not.
func TestMain(m *testing.M) { testenv.Main(m, nil) }

// newPool is a pool on the test server whose search_path is empty, so that
// any table name the kit forgets to qualify fails.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = ""
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// fakeTB records what a helper of the kit reports instead of failing the
// test, so that a test can check that the kit catches a fault. Fatal ends
// the helper's goroutine, as testing.T's does.
type fakeTB struct {
	testing.TB // the real test: Context, Cleanup, Name, Log
	mu         sync.Mutex
	errs       []string
	fatal      bool
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}
func (f *fakeTB) Error(args ...any) { f.Errorf("%s", fmt.Sprint(args...)) }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	f.mu.Lock()
	f.fatal = true
	f.mu.Unlock()
	runtime.Goexit()
}
func (f *fakeTB) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }
func (f *fakeTB) Fail()             { f.Errorf("Fail") }
func (f *fakeTB) FailNow()          { f.Fatalf("FailNow") }
func (f *fakeTB) Failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.errs) > 0
}

// report runs helper with a fakeTB, in a goroutine of its own (Fatal ends
// it), and returns what it reported.
func report(t *testing.T, helper func(tb testing.TB)) *fakeTB {
	t.Helper()
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		helper(f)
	}()
	<-done
	return f
}

// requireReported fails t unless f got a report containing each of words.
func requireReported(t *testing.T, f *fakeTB, words ...string) {
	t.Helper()
	all := strings.Join(f.errs, "\n")
	if len(f.errs) == 0 {
		t.Fatalf("the kit reported nothing; want a report with %q", words)
	}
	for _, w := range words {
		if !strings.Contains(all, w) {
			t.Fatalf("the kit reported:\n%s\nwant a report with %q", all, w)
		}
	}
	t.Logf("the kit reported, as wanted:\n%s", all)
}

// requireClean fails t when f got any report.
func requireClean(t *testing.T, f *fakeTB) {
	t.Helper()
	if len(f.errs) > 0 {
		t.Fatalf("the kit reported a fault in a correct handler:\n%s", strings.Join(f.errs, "\n"))
	}
}
