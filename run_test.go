package idemkit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idemkit/idemkit"
)

// TestRunAllStopsAllOnTheFirstError: one runner failing cancels the
// others' context; RunAll returns its error once every runner returned.
func TestRunAllStopsAllOnTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	started := make(chan struct{}, 2)
	returned := make(chan error, 2)
	waiter := idemkit.RunnerFunc(func(ctx context.Context) error {
		started <- struct{}{}
		<-ctx.Done()
		returned <- ctx.Err()
		return nil
	})
	failing := idemkit.RunnerFunc(func(ctx context.Context) error {
		<-started // fail only once both waiters run
		<-started
		return boom
	})
	if err := idemkit.RunAll(context.Background(), waiter, failing, waiter); !errors.Is(err, boom) {
		t.Fatalf("RunAll = %v, want boom", err)
	}
	for range 2 {
		select {
		case err := <-returned:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("a waiter returned after %v, want its context cancelled", err)
			}
		default:
			t.Fatal("RunAll returned before every runner had")
		}
	}
}

// TestRunAllUntilTheContextEnds: without an error, RunAll returns nil once
// its context ended and every runner returned.
func TestRunAllUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{}, 3)
	r := idemkit.RunnerFunc(func(ctx context.Context) error {
		started <- struct{}{}
		<-ctx.Done()
		return nil
	})
	done := make(chan error, 1)
	go func() { done <- idemkit.RunAll(ctx, r, r, r) }()
	for range 3 {
		<-started
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunAll = %v, want nil", err)
	}
	if err := idemkit.RunAll(context.Background()); err != nil {
		t.Fatalf("RunAll of nothing = %v, want nil", err)
	}
}
