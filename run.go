package idemkit

import (
	"context"
	"sync"
)

// Runner is what runs until its context ends: a consumer.Runner, an
// outbox.Relay or Dispatcher, an idemotel Monitor.
type Runner interface {
	Run(ctx context.Context) error
}

// RunnerFunc adapts a function to Runner.
type RunnerFunc func(ctx context.Context) error

// Run calls f.
func (f RunnerFunc) Run(ctx context.Context) error { return f(ctx) }

// RunAll runs each runner in a goroutine of its own until ctx ends or one of
// them returns an error: that error cancels the context of the others. It
// returns once every runner has returned, with the first error; nil when
// they all returned without one (ctx ended). A service's consumers, relays
// and monitor run together this way, and a SIGTERM (ctx) stops them all:
//
//	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
//	defer stop()
//	err := idemkit.RunAll(ctx, payments, relay, monitor)
func RunAll(ctx context.Context, runners ...Runner) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, r := range runners {
		wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				once.Do(func() {
					first = err
					cancel()
				})
			}
		})
	}
	wg.Wait()
	return first
}
