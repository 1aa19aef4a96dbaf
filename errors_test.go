package idemkit_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/idemkit/idemkit"
	"github.com/idemkit/idemkit/consumer"
	"github.com/idemkit/idemkit/dedup"
	"github.com/idemkit/idemkit/dlq"
	"github.com/idemkit/idemkit/idemhttp"
	"github.com/idemkit/idemkit/outbox"
)

func TestPanicError(t *testing.T) {
	boom := errors.New("boom")
	var err error
	func() {
		defer func() { err = idemkit.NewPanicError("consumer: handler", recover()) }()
		panic(fmt.Errorf("wrapped: %w", boom))
	}()
	var perr *idemkit.PanicError
	if !errors.As(err, &perr) || !errors.Is(err, boom) || len(perr.Stack) == 0 {
		t.Fatalf("err = %v; want a *PanicError with a stack that unwraps to boom", err)
	}
	if got := err.Error(); got != "consumer: handler panicked: wrapped: boom" || strings.Contains(got, "goroutine") {
		t.Fatalf("Error() = %q", got)
	}
	if (&idemkit.PanicError{Value: 42}).Unwrap() != nil {
		t.Fatal("a non-error panic value unwraps to something")
	}
}

// Every package's ErrNotMigrated matches idemkit.ErrNotMigrated: one check
// for "run migrate up" whichever store said it (issue 12).
func TestErrNotMigratedEverywhere(t *testing.T) {
	for name, err := range map[string]error{
		"consumer": consumer.ErrNotMigrated, "dedup": dedup.ErrNotMigrated, "outbox": outbox.ErrNotMigrated,
		"dlq": dlq.ErrNotMigrated, "idemhttp": idemhttp.ErrNotMigrated,
	} {
		if !errors.Is(err, idemkit.ErrNotMigrated) || !strings.HasPrefix(err.Error(), name+":") {
			t.Errorf("%s.ErrNotMigrated = %q: want it to match idemkit.ErrNotMigrated and name its package", name, err)
		}
	}
}
